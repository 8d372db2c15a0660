#!/usr/bin/env python3
"""Unpack the xz payload of a bzImage (vmlinuz) into a plain ELF vmlinux.

QEMU boots such an ELF directly through its PVH entry, which is about 2.5x faster under TCG
than letting the compressed image decompress itself.
"""
import lzma
import sys

XZ_MAGIC = b"\xfd7zXZ\x00"


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: extract-vmlinux.py VMLINUZ OUT", file=sys.stderr)
        return 2
    data = open(sys.argv[1], "rb").read()
    start = data.find(XZ_MAGIC)
    while start != -1:
        try:
            dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
            out = dec.decompress(data[start:])
        except lzma.LZMAError:
            start = data.find(XZ_MAGIC, start + 1)
            continue
        if out[:4] == b"\x7fELF":
            with open(sys.argv[2], "wb") as f:
                f.write(out)
            return 0
        start = data.find(XZ_MAGIC, start + 1)
    print(f"no xz-compressed ELF found in {sys.argv[1]}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

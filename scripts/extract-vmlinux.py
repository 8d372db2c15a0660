#!/usr/bin/env python3
"""Unpack the xz or zstd payload of a bzImage (vmlinuz) into a plain ELF vmlinux.

QEMU boots such an ELF directly through its PVH entry, which is about 2.5x faster under TCG
than letting the compressed image decompress itself.
"""
import lzma
import shutil
import subprocess
import sys

XZ_MAGIC = b"\xfd7zXZ\x00"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def zstd_payloads(data: bytes):
    """ELF images behind each zstd frame magic (Python 3.11 has no zstd: use the tool)."""
    if not shutil.which("zstd"):
        return
    start = data.find(ZSTD_MAGIC)
    while start != -1:
        # zstd stops with an error at the bytes after the frame; what it wrote is the frame.
        out = subprocess.run(["zstd", "-dc"], input=data[start:], capture_output=True).stdout
        if out[:4] == b"\x7fELF":
            yield out
        start = data.find(ZSTD_MAGIC, start + 1)


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
    for out in zstd_payloads(data):
        with open(sys.argv[2], "wb") as f:
            f.write(out)
        return 0
    print(f"no xz- or zstd-compressed ELF found in {sys.argv[1]}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

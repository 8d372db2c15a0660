#!/usr/bin/env bash
# docs/libvirt.md's recipe for an existing VM, run against libvirt's QEMU driver (libvirtd
# 11 in the QEMU root, which scripts/provision --for-tests sets up; no VM is started): a
# defined domain without shared memory refuses the NIC `qemu-args --libvirt=interface`
# prints; after `virsh edit` adds what `qemu-args --libvirt=memory` prints, `virsh
# attach-device --config` takes it, and the domain's persistent XML holds the NIC as
# printed and the shared memory.
# vnic-kernels: bookworm
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run
[[ -f $QEMU_ROOT/.vnic-libvirt-ready ]] || die "libvirt is missing from the QEMU root: run scripts/provision --for-tests"

vm=vnic-attach-$$
sock=/run/dpaa-vnic/$vm.sock
# The recipe's two pieces, printed as a user prints them.
"$VNIC_BIN" qemu-args --libvirt=interface --socket "$sock" --queues 2 --mac 52:54:00:d0:aa:03 >"$RUN_DIR/nic.xml"
"$VNIC_BIN" qemu-args --libvirt=memory --socket "$sock" >"$RUN_DIR/memory.xml"
# The existing VM: no shared memory, no NIC.
cat >"$RUN_DIR/vm.xml" <<EOF
<domain type='qemu'>
  <name>$vm</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
  </os>
  <devices/>
</domain>
EOF
# `virsh edit` runs $EDITOR on the domain's XML: this one pastes the memoryBacking inside
# <domain>, where a person would.
cat >"$RUN_DIR/editor" <<EOF
#!/bin/bash
sed -i '/^<domain/r $RUN_IN_CHROOT/memory.xml' "\$1"
EOF
chmod +x "$RUN_DIR/editor"
cat >"$RUN_DIR/recipe.sh" <<EOF
set -u
libvirtd >/tmp/libvirtd.log 2>&1 & lv=\$!
trap 'kill -9 \$lv' EXIT
for _ in \$(seq 100); do [[ -S /run/libvirt/libvirt-sock ]] && break; sleep 0.1; done
v() { timeout 30 virsh -q -c qemu:///system "\$@"; }
v define $RUN_IN_CHROOT/vm.xml >/dev/null || exit 1
if v attach-device $vm $RUN_IN_CHROOT/nic.xml --config 2>$RUN_IN_CHROOT/refused.txt; then
    echo "attached without shared memory"; exit 1
fi
EDITOR=$RUN_IN_CHROOT/editor v edit $vm >/dev/null || exit 1
v attach-device $vm $RUN_IN_CHROOT/nic.xml --config || exit 1
v dumpxml --inactive $vm >$RUN_IN_CHROOT/after.xml || exit 1
v undefine $vm >/dev/null
EOF
# libvirtd sees a /dev without /dev/kvm: KVM does not work here, and probing it stalls
# libvirt's capability probe. Its mounts live in a mount namespace of their own.
timeout 120 unshare -m --propagation private bash -c '
    R=$1
    mount -t proc proc "$R/proc" && mount --rbind /sys "$R/sys" && mount -t tmpfs tmpfs "$R/dev" \
        && mount -t tmpfs tmpfs "$R/run" || exit 1
    for n in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
        IFS=: read -r name major minor <<<"$n"
        mknod -m 666 "$R/dev/$name" c "$major" "$minor"
    done
    mkdir "$R/dev/pts" "$R/dev/shm"
    chroot "$R" /bin/bash "$2"' _ "$QEMU_ROOT" "$RUN_IN_CHROOT/recipe.sh" >"$RUN_DIR/recipe.log" 2>&1 \
    || { cat "$RUN_DIR/recipe.log" >&2; die "the recipe failed under libvirtd"; }
log "without shared memory, libvirt refused the NIC: $(tr -d '\n' <"$RUN_DIR/refused.txt")"
grep -q "requires shared memory" "$RUN_DIR/refused.txt" || die "refused for another reason"
python3 - "$RUN_DIR/after.xml" "$RUN_DIR/nic.xml" <<'PY' || die "the domain does not hold what was attached"
import sys
import xml.etree.ElementTree as ET
dom = ET.parse(sys.argv[1]).getroot()
want = ET.parse(sys.argv[2]).getroot()
mb = dom.find("memoryBacking")
assert mb is not None and mb.find("access").get("mode") == "shared" and mb.find("source").get("type") == "memfd", "memoryBacking"
nics = dom.findall("devices/interface")
assert len(nics) == 1 and nics[0].get("type") == "vhostuser", [n.get("type") for n in nics]
got = nics[0]
for path in ["mac", "source", "model", "driver"]:
    for k, v in want.find(path).attrib.items():
        assert got.find(path).get(k) == v, (path, k, got.find(path).attrib)
assert got.find("source/reconnect").get("enabled") == "yes"
print("VNIC-ATTACHED", got.find("source").get("path"), "queues", got.find("driver").get("queues"))
PY
log "ok: virsh attach-device --config put the vhostuser NIC and the shared memory in $vm's definition"

#!/usr/bin/env bash
# The systemd units, under a running systemd, installed both ways: by `scripts/install`
# (/usr/local and /etc), and as the Debian package `scripts/package` builds (`dpkg -i` in
# the guest; /usr and /usr/lib). This host has no systemd as PID 1, so a guest boots
# bookworm's systemd (the rootfs scripts/provision packs as an initramfs) with that on
# top, and runs what an operator would:
# `systemctl start dpaa-vnic@vm1.socket`, a frontend's first message on the socket (the
# service starts on it and answers GET_FEATURES through the inherited descriptor),
# Type=notify's READY=1 (the unit turns active), `ctl stats` on the unit's control socket,
# the sandbox in force (no new privileges, CAP_NET_ADMIN only), a stop on SIGTERM with
# result success, and the socket removed with its unit; the package is then removed with
# `dpkg -r`, and its files with it. The guest prints VNICSD: lines.
# vnic-kernels: bookworm
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run
[[ -f $SYSTEMD_CPIO ]] || die "the systemd rootfs is missing: run scripts/provision --for-tests"

# overlay METHOD DIR: what is installed on top of the rootfs, by METHOD (install or deb).
overlay() {
    local method=$1 dir=$2
    case $method in
        install)
            "$REPO_ROOT/scripts/install" --destdir "$dir" >"$RUN_DIR/install.log" 2>&1 \
                || { cat "$RUN_DIR/install.log" >&2; die "scripts/install failed"; }
            # The initramfs is unpacked into the guest's memory: the debug info is dead
            # weight there.
            strip "$dir/usr/local/bin/dpaa-vnic"
            ;;
        deb)
            local deb
            deb=$("$REPO_ROOT/scripts/package" 2>"$RUN_DIR/package.log" | tail -1) \
                || { cat "$RUN_DIR/package.log" >&2; die "scripts/package failed"; }
            install -D -m 0644 "$deb" "$dir/root/dpaa-vnic.deb"
            ;;
    esac
    echo "$method" | install -D -m 0644 /dev/stdin "$dir/etc/vnic-install-method"
    check_script "$dir"
}

# check_script DIR: the check, as a unit that runs once the system is up.
check_script() {
    local overlay=$1
install -D -m 0755 /dev/stdin "$overlay/usr/local/bin/vnic-systemd-check" <<'CHECK'
#!/bin/bash
set -u
say() { echo "VNICSD: $*" >/dev/console; }
fail() {
    say "FAIL $*"
    journalctl -b -u 'dpaa-vnic@*' --no-pager 2>&1 | tail -30 >/dev/console
    systemctl poweroff
    exit 1
}
prop() { systemctl show -P "$2" "$1"; }
method=$(cat /etc/vnic-install-method)
if [[ $method == deb ]]; then
    dpkg -i /root/dpaa-vnic.deb >/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log >/dev/console; fail "dpkg -i"; }
    [[ $(dpkg-query -W -f='${Status}' dpaa-vnic) == "install ok installed" ]] || fail "dpkg: not installed"
    for f in /usr/bin/dpaa-vnic /usr/lib/systemd/system/dpaa-vnic@.socket \
        /usr/lib/systemd/system/dpaa-vnic@.service /usr/share/qemu/vhost-user/50-dpaa-vnic.json \
        /usr/share/man/man1/dpaa-vnic.1.gz /usr/share/bash-completion/completions/dpaa-vnic; do
        [[ -e $f ]] || fail "the package lacks $f"
    done
    grep -q '"binary": "/usr/bin/dpaa-vnic"' /usr/share/qemu/vhost-user/50-dpaa-vnic.json \
        || fail "QEMU's descriptor does not name /usr/bin/dpaa-vnic"
    say "dpkg -i installed dpaa-vnic $(dpkg-query -W -f='${Version}' dpaa-vnic) ($(dpkg -L dpaa-vnic | wc -l) paths)"
fi
bin=$(command -v dpaa-vnic) || fail "no dpaa-vnic on PATH"
say "installed by $method: $bin"
svc=dpaa-vnic@vm1.service
say "PID 1 is $(cat /proc/1/comm), systemd $(systemctl --version | head -1 | cut -d' ' -f2)"
systemctl start dpaa-vnic@vm1.socket || fail "the socket unit did not start"
sock=/run/dpaa-vnic/vm1.sock
[[ -S $sock ]] || fail "no socket at $sock"
[[ $(stat -c '%a %G' "$sock") == "660 kvm" ]] || fail "socket mode and group: $(stat -c '%a %G' "$sock")"
[[ $(prop $svc ActiveState) == inactive ]] || fail "the service started before any frontend"
# A frontend's first message: VHOST_USER_GET_FEATURES (request 1, version flag 0x1, no
# payload); the reply carries the reply flag (0x4) and the 8-byte feature bits.
feat=$(python3 - "$sock" <<'PY'
import socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(20)
s.connect(sys.argv[1])
s.sendall(struct.pack("<III", 1, 1, 0))
buf = b""
while len(buf) < 20:
    chunk = s.recv(20 - len(buf))
    if not chunk:
        break
    buf += chunk
req, flags, size = struct.unpack("<III", buf[:12])
assert req == 1 and flags & 0x4 and size == 8, (req, flags, size)
print(hex(struct.unpack("<Q", buf[12:20])[0]))
PY
) || fail "no answer to GET_FEATURES through the activated socket"
say "GET_FEATURES answered through the socket systemd handed over: $feat"
((feat >> 32 & 1 && feat >> 30 & 1)) || fail "features $feat lack VERSION_1 or PROTOCOL_FEATURES"
# Type=notify: the unit is active only once the daemon said READY=1.
for _ in $(seq 50); do
    [[ $(prop $svc ActiveState) == active ]] && break
    sleep 0.2
done
[[ $(prop $svc ActiveState) == active ]] || fail "service $(prop $svc ActiveState), not active"
pid=$(prop $svc MainPID)
say "service active after READY=1, main PID $pid ($(prop $svc SubState))"
"$bin" ctl --control /run/dpaa-vnic/vm1/ctl stats | grep -q '"version"' \
    || fail "ctl stats on the unit's control socket"
say "ctl stats answered on /run/dpaa-vnic/vm1/ctl"
grep -Eq '^NoNewPrivs:\s+1' "/proc/$pid/status" || fail "NoNewPrivileges not in force"
capbnd=$(awk '/^CapBnd/ {print $2}' "/proc/$pid/status")
[[ $capbnd == 0000000000001000 ]] || fail "capability bounding set $capbnd, not CAP_NET_ADMIN alone"
say "sandbox in force: no new privileges, bounding set CAP_NET_ADMIN alone"
systemctl stop $svc || fail "systemctl stop"
[[ $(prop $svc Result) == success ]] || fail "stopped with result $(prop $svc Result)"
say "service stopped on SIGTERM, result success"
systemctl stop dpaa-vnic@vm1.socket || fail "stopping the socket unit"
[[ ! -e $sock ]] || fail "the socket was left behind"
if [[ $method == deb ]]; then
    dpkg -r dpaa-vnic >/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log >/dev/console; fail "dpkg -r"; }
    [[ ! -e /usr/bin/dpaa-vnic && ! -e /usr/lib/systemd/system/dpaa-vnic@.socket ]] \
        || fail "dpkg -r left the binary or a unit behind"
    say "dpkg -r removed the package and its files"
fi
say "PASS"
systemctl poweroff
CHECK
local units=$overlay/etc/systemd/system
install -D -m 0644 /dev/stdin "$units/vnic-systemd-check.service" <<'UNIT'
[Unit]
Description=dpaa-vnic's units under systemd (guest-tests/systemd-units.sh)
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/usr/local/bin/vnic-systemd-check
StandardOutput=journal+console
[Install]
WantedBy=multi-user.target
UNIT
mkdir -p "$units/multi-user.target.wants"
ln -s ../vnic-systemd-check.service "$units/multi-user.target.wants/"
}

# boot METHOD: the rootfs with METHOD's overlay, booted until the check powers it off.
boot() {
    local method=$1 overlay=$RUN_DIR/overlay-$1
    overlay "$method" "$overlay"
    # The kernel unpacks concatenated archives in turn: the rootfs, then the installed files.
    (cd "$overlay" && find . | busybox cpio -o -H newc 2>/dev/null) >"$RUN_DIR/overlay.cpio"
    cat "$SYSTEMD_CPIO" "$RUN_DIR/overlay.cpio" >"$RUN_DIR/systemd.cpio"
    rm -rf "$overlay" "$RUN_DIR/overlay.cpio"
    log "booting systemd in a guest, installed by $method ($(du -h "$RUN_DIR/systemd.cpio" | cut -f1) initramfs)"
    # A whole system boots here: 30 s under TCG on this 2-CPU box, so at least 4 minutes.
    local boot_timeout=$((GUEST_TIMEOUT > 240 ? GUEST_TIMEOUT : 240))
    # shellcheck disable=SC2046
    timeout "$boot_timeout" chroot "$QEMU_ROOT" qemu-system-x86_64 $(accel_args) -m 1024 -smp 1 \
        -nographic -no-reboot -nodefaults -serial stdio \
        -kernel "/vnic/guest/$KERNEL_KEY/kernel" -initrd "$RUN_IN_CHROOT/systemd.cpio" \
        -append "console=ttyS0 rdinit=/lib/systemd/systemd panic=-1 systemd.mask=serial-getty@ttyS0.service" \
        </dev/null >"$RUN_DIR/guest-$method.log" 2>&1 &
    local qemu=$!
    PIDS+=("$qemu")
    wait "$qemu" || die "the systemd guest ($method) did not power off within $boot_timeout s"
    rm -f "$RUN_DIR/systemd.cpio"
    grep -a 'VNICSD:' "$RUN_DIR/guest-$method.log" | sed 's/\r$//' >&2
    grep -aq 'VNICSD: PASS' "$RUN_DIR/guest-$method.log" || die "the units' check ($method) did not pass under systemd"
    log "systemd units ($method): socket activation, READY=1, the sandbox and a clean stop under systemd $(
        sed -n 's/.*VNICSD: PID 1 is systemd, systemd \([0-9]*\).*/\1/p' "$RUN_DIR/guest-$method.log")"
}

boot install
boot deb

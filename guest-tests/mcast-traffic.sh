#!/usr/bin/env bash
# What the filter lets through, checked against an independent oracle. A guest (device
# attachment) joins 20 groups; the host sends 5 datagrams to each of 20 other groups, then to
# each joined group. For each layout: the guest's sockets receive exactly the joined traffic;
# every datagram to a non-joined group is either filtered by the NIC or, where its hash bucket
# is in use, delivered as a false positive (counted by the daemon, dropped by the guest's
# stack). Which buckets are in use comes from `ctl filter`; which bucket a group hashes to is
# recomputed here in Python (zlib CRC-32, bit parity), not taken from the daemon.
# vnic-kernels: bookworm trixie-bpo
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

J=20
K=5
make_initrd traffic <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.22.0.2/24 dev eth0
vnic-udp recv 7020 100000 10 >/tmp/rx 2>&1 & r=\$!
vnic-mcast ip eth0 239.5.0.1 $J 7021 120 >/tmp/m 2>&1 & m=\$!
wait_line /tmp/m VNIC-JOINED || exit 1
echo "VNIC-READY"
wait \$r
grep received /tmp/rx | sed 's/^/VNIC-RX /'
wait \$m || exit 1
report_stats eth0
GUEST

for layout in exact memac dtsec-ext tgec; do
    ns=vnic-mt-$layout-$$
    make_netns "$ns"
    start_daemon d-$layout "$ns" --socket "$RUN_DIR/$layout.sock" --tap vtap0 --filter "$layout"
    ip netns exec "$ns" ip addr add 10.22.0.1/24 dev vtap0
    ip netns exec "$ns" ip link set vtap0 up
    ip netns exec "$ns" ip route add 224.0.0.0/4 dev vtap0
    start_guest g-$layout device $layout.sock traffic
    wait_console g-$layout "VNIC-READY" "$GUEST_TIMEOUT" || exit 1
    # The guest's rx-mode update may trail its joins by a moment.
    wait_for 10 "the joined groups in the daemon's table" bash -c \
        "'$VNIC_BIN' ctl --control '$RUN_DIR/d-$layout.ctl' filter | grep -c '01:00:5e:05:00:' | grep -qx $J"
    filtered0=$(daemon_counter d-$layout 0 rx_filtered)
    fp0=$(daemon_counter d-$layout 0 rx_hash_false_positive)
    for g in $(seq 1 $J); do
        ip netns exec "$ns" "$HOST_UDP" send 239.6.0.$g 7020 $K 64 1000 >/dev/null
    done
    for g in $(seq 1 $J); do
        ip netns exec "$ns" "$HOST_UDP" send 239.5.0.$g 7020 $K 64 1000 >/dev/null
    done
    buckets=$(ctl d-$layout filter | python3 -c 'import json,sys; print(" ".join(str(b) for b, _ in json.load(sys.stdin)["ports"][0]["filter"]["buckets"]))')
    expected_fp=$(python3 - "$layout" "$J" "$K" "$buckets" <<'PY'
import sys, zlib
layout, j, k, used = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), set(map(int, sys.argv[4].split()))
def mac(g):  # RFC 1112: 01:00:5e + low 23 bits of the group
    a, b, c, d = map(int, g.split("."))
    return bytes([1, 0, 0x5E, b & 0x7F, c, d])
def bucket(m):
    if layout == "memac":
        return sum((bin(o).count("1") & 1) << i for i, o in enumerate(m))
    crc = ~zlib.crc32(m) & 0xFFFFFFFF          # reflected CRC-32, preset ~0, no final xor
    rev = int(f"{crc:032b}"[::-1], 2)
    # dTSEC extended mode and the TGEC (fman_tgec.c): the top 9 bits; dTSEC normal: 256 + top 8.
    return rev >> 23 if layout in ("dtsec-ext", "tgec") else 256 + (rev >> 24)
if layout == "exact":
    print(0)
else:
    print(k * sum(1 for g in range(1, j + 1) if bucket(mac(f"239.6.0.{g}")) in used))
PY
)
    wait_console g-$layout "VNIC-RX " 60 || exit 1
    ip netns exec "$ns" "$HOST_UDP" send 10.22.0.2 7021 1 16 >/dev/null
    wait_guest g-$layout
    fp=$(($(daemon_counter d-$layout 0 rx_hash_false_positive) - fp0))
    filtered=$(($(daemon_counter d-$layout 0 rx_filtered) - filtered0))
    expect_eq "$layout: guest sockets received only the joined traffic" \
        "$(grep -a 'VNIC-RX' "$RUN_DIR/g-$layout.log" | tr -d '\r' | awk '{print $3}')" $((J * K))
    expect_eq "$layout: hash false positives (oracle: buckets in use)" "$fp" "$expected_fp"
    expect_eq "$layout: filtered by the NIC" "$filtered" $((J * K - expected_fp))
    compare_counters g-$layout d-$layout 0
    printf 'REPORT mcast-traffic %-9s %d datagrams to non-joined groups: %d filtered, %d false positives (%d buckets in use)\n' \
        "$layout" $((J * K)) "$filtered" "$fp" "$(wc -w <<<"$buckets")" | tee -a "$RUN_DIR/../reports.txt"
    stop_daemon d-$layout
done

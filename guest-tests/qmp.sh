#!/usr/bin/env bash
# Net attachment with --qmp: QEMU keeps the control queue, dpaa-vnic follows QEMU's rx filter
# (NIC_RX_FILTER_CHANGED, query-rx-filter). With 30 groups (inside QEMU's 64-entry table) the
# daemon's table equals the guest's dev_mcast and the DPAA filter drops traffic to groups
# the guest did not join; past 64 entries QEMU reports overflow and the port goes allmulti.
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

make_initrd qmp <<'GUEST'
# One IGMP report per change (no retransmissions a second later), so that nothing is
# still on its way out when the counters are read below.
echo 1 >/proc/sys/net/ipv4/igmp_qrv
wait_carrier eth0 || exit 1
ip addr add 10.11.0.2/24 dev eth0
vnic-udp recv 7040 100000 12 >/tmp/rx 2>&1 & r=$!
vnic-udp recv 7032 1 180 >/dev/null 2>&1 & go=$!
vnic-mcast ip eth0 239.7.0.1 30 7031 120 >/tmp/m1 2>&1 & m1=$!
wait_line /tmp/m1 VNIC-JOINED || exit 1
echo "VNIC-PHASE1 $(mcast_snapshot eth0)"
wait $r
grep received /tmp/rx | sed 's/^/VNIC-RX /'
wait $go || exit 1
vnic-mcast ip eth0 239.8.0.1 100 7033 120 >/tmp/m2 2>&1 & m2=$!
wait_line /tmp/m2 VNIC-JOINED || exit 1
echo "VNIC-PHASE2 $(mcast_snapshot eth0)"
wait $m1 || exit 1
wait $m2 || exit 1
report_stats eth0
GUEST

ns=vnic-qmp-$$
make_netns "$ns"
start_daemon d "$ns" --socket "$RUN_DIR/p.sock" --tap vtap0 --filter dtsec-ext --qmp "$RUN_DIR/qmp.sock,nic=nic0"
ip netns exec "$ns" ip addr add 10.11.0.1/24 dev vtap0
ip netns exec "$ns" ip link set vtap0 up
ip netns exec "$ns" ip route add 224.0.0.0/4 dev vtap0
GUEST_EXTRA_ARGS="-qmp unix:$RUN_IN_CHROOT/qmp.sock,server=on,wait=off" start_guest g net p.sock qmp

filter_field() { ctl d filter | python3 -c "import json,sys; p=json.load(sys.stdin)['ports'][0]; print($1)"; }
console() { tr -d '\r' <"$RUN_DIR/g.log"; }

wait_console g "VNIC-PHASE1 " "$GUEST_TIMEOUT" || exit 1
read -r _ gdig gcount < <(console | grep -a "VNIC-PHASE1 ")
got=""
for _ in $(seq 100); do read -r got _ < <(daemon_mcast_digest d); [[ $got == "$gdig" ]] && break; sleep 0.1; done
expect_eq "phase 1: daemon table (from QMP) = guest dev_mcast ($gcount entries)" "$got" "$gdig"
expect_eq "phase 1: promiscuous" "$(filter_field "p['rx_mode']['promisc']")" False
expect_eq "phase 1: allmulti" "$(filter_field "p['rx_mode']['allmulti']")" False
filtered0=$(daemon_counter d 0 rx_filtered)
fp0=$(daemon_counter d 0 rx_hash_false_positive)
for g in 1 2 3 4 5; do
    ip netns exec "$ns" "$HOST_UDP" send 239.9.0.$g 7040 5 64 1000 >/dev/null
    ip netns exec "$ns" "$HOST_UDP" send 239.7.0.$g 7040 5 64 1000 >/dev/null
done
wait_console g "VNIC-RX " 60 || exit 1
expect_eq "phase 1: guest sockets received only the joined traffic" \
    "$(console | grep -a 'VNIC-RX received' | awk '{print $3}')" 25
expect_eq "phase 1: non-joined traffic filtered or counted as false positive" \
    "$(($(daemon_counter d 0 rx_filtered) - filtered0 + $(daemon_counter d 0 rx_hash_false_positive) - fp0))" 25
expect_ge "phase 1: some of it filtered by the NIC" "$(($(daemon_counter d 0 rx_filtered) - filtered0))" 1

ip netns exec "$ns" "$HOST_UDP" send 10.11.0.2 7032 1 16 >/dev/null
wait_console g "VNIC-PHASE2 " "$GUEST_TIMEOUT" || exit 1
allmulti=""
for _ in $(seq 100); do
    allmulti=$(filter_field "p['rx_mode']['allmulti']")
    [[ $allmulti == True ]] && break
    sleep 0.1
done
expect_eq "phase 2: 130 groups overflow QEMU's 64-entry table: allmulti" "$allmulti" True
ip netns exec "$ns" "$HOST_UDP" send 10.11.0.2 7031 1 16 >/dev/null
ip netns exec "$ns" "$HOST_UDP" send 10.11.0.2 7033 1 16 >/dev/null
wait_guest g
compare_counters g d 0

#!/usr/bin/env bash
# A guest that sends from its neighbour's MAC. Two guests in the device
# attachment and the host's tap on one daemon; guest B puts its NIC in promiscuous mode and
# floods broadcasts whose source is guest A's MAC while the host sends A 100 datagrams.
#   --port-mac-lock off:  the switch learns A's address on B's port, and A's traffic goes
#                         to B (the attack works: this run proves the test can see it);
#   --port-mac-lock auto: (the default) B's spoofed frames are dropped and counted, B
#                         cannot set A's MAC on its NIC either, and A gets its traffic.
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

A_MAC=52:54:00:d0:aa:01
SPOOF=1500
N=100

make_initrd a <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.66.0.1/24 dev eth0
retry 60 ping -c 1 -W 1 10.66.0.100 || exit 1
echo "VNIC-A-READY"
# Quiet from here on: only B's frames name A's address while the host sends.
sleep 25
GUEST

make_initrd b <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.66.0.2/24 dev eth0
ip link set eth0 promisc on
retry 60 ping -c 1 -W 1 10.66.0.100 || exit 1
if ip link set eth0 address $A_MAC 2>/dev/null; then echo "VNIC-MACSET accepted"; else echo "VNIC-MACSET refused"; fi
echo "VNIC-SPOOFING"
vnic-raw eth0 ff:ff:ff:ff:ff:ff 10.66.0.2 10.66.0.100 9 $SPOOF broken $A_MAC || exit 1
GUEST

for lock in off auto; do
    ns=vnic-spoof-$lock-$$
    make_netns "$ns"
    d=d-$lock
    start_daemon $d "$ns" --socket "$RUN_DIR/a-$lock.sock" --socket "$RUN_DIR/b-$lock.sock" --tap vtap0 \
        --port-mac-lock $lock
    ip netns exec "$ns" ip addr add 10.66.0.100/24 dev vtap0
    ip netns exec "$ns" ip link set vtap0 up
    # The host knows A's MAC without asking: an ARP exchange would let A's answer teach
    # the switch A's port again.
    ip netns exec "$ns" ip neigh replace 10.66.0.1 lladdr $A_MAC dev vtap0 nud permanent
    start_guest ga-$lock device a-$lock.sock a 1
    start_guest gb-$lock device b-$lock.sock b 1 52:54:00:d0:aa:02
    wait_console ga-$lock "VNIC-A-READY" "$GUEST_TIMEOUT" || exit 1
    wait_console gb-$lock "VNIC-SPOOFING" "$GUEST_TIMEOUT" || exit 1
    # B's spoofed broadcasts are flowing (2 ms apart, 3 s in all): send A its traffic.
    sleep 0.5
    a0=$(daemon_counter $d 0 rx_packets)
    b0=$(daemon_counter $d 1 rx_packets)
    ip netns exec "$ns" "$HOST_UDP" send 10.66.0.1 5009 $N 200 1000 >/dev/null
    sleep 0.5
    a1=$(daemon_counter $d 0 rx_packets)
    b1=$(daemon_counter $d 1 rx_packets)
    wait_guest gb-$lock
    wait_guest ga-$lock
    spoofed=$(daemon_counter $d 1 tx_spoofed)
    macset=$(grep -a -o "VNIC-MACSET [a-z]*" "$RUN_DIR/gb-$lock.log" | tail -1)
    to_a=$((a1 - a0)) to_b=$((b1 - b0))
    if [[ $lock == off ]]; then
        expect_ge "lock off: A's datagrams that reached the spoofer" $to_b $((N * 9 / 10))
        expect_eq "lock off: frames refused" "$spoofed" 0
        expect_eq "lock off: B setting A's MAC" "$macset" "VNIC-MACSET accepted"
    else
        expect_ge "lock auto: A's datagrams that reached A" $to_a $N
        if ((to_b > 5)); then
            log "FAIL: lock auto: the spoofer received $to_b frames while the host sent A $N"
            exit 1
        fi
        log "ok: lock auto: the spoofer received $to_b frames (broadcast noise at most)"
        expect_eq "lock auto: spoofed frames refused" "$spoofed" $SPOOF
        expect_eq "lock auto: B setting A's MAC" "$macset" "VNIC-MACSET refused"
    fi
    printf 'REPORT spoof lock=%-4s host sent A %d datagrams meanwhile: A'"'"'s port received %d frames (B'"'"'s broadcasts included), the spoofer'"'"'s %d; spoofed frames dropped %s\n' \
        "$lock" $N $to_a $to_b "$spoofed" | tee -a "$RUN_DIR/../reports.txt"
done

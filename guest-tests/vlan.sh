#!/usr/bin/env bash
# VLAN filtering in the device attachment (VIRTIO_NET_F_CTRL_VLAN, docs/filter.md). The
# guest loads 8021q and makes eth0.100: its driver adds VLAN 100 through the control queue.
# The host writes N datagrams tagged 200 (a VLAN the guest never added) and then N tagged
# 100 to the guest's MAC, over the tap. The daemon drops VLAN 200's
# (rx_vlan_filtered), so the guest's eth0 never counts them, and the guest receives VLAN
# 100's. Then the guest deletes eth0.100: its driver's VLAN_DEL takes 100 off the table.
# The net attachment runs the same, with --qmp and without (the control, below).
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

N=300
MAC=52:54:00:d0:aa:01
make_initrd guest <<GUEST
for m in llc stp garp mrp 8021q; do
    if [ -f /lib/modules/\$m.ko ]; then insmod /lib/modules/\$m.ko || exit 1; fi
done
vnic-udp recv 6101 1 240 >/tmp/done.txt &
done_pid=\$!
wait_carrier eth0 || exit 1
ip addr add 10.77.0.2/24 dev eth0
ip link add link eth0 name eth0.100 type vlan id 100 || exit 1
ip addr add 10.100.0.2/24 dev eth0.100
ip link set eth0.100 up
vnic-udp recv 6100 $N 120 || exit 1
echo "VNIC-VLAN eth0 rx_packets=\$(cat /sys/class/net/eth0/statistics/rx_packets)"
ip link del eth0.100 || exit 1
echo "VNIC-VLAN eth0.100 removed"
# Up until the host has read the table: a reset empties it.
wait \$done_pid || exit 1
report_stats eth0
GUEST

# vlans DAEMON: the VLAN IDs `ctl filter` lists for the guest's port, space-separated
# ("all" when every VLAN passes).
vlans() {
    ctl "$1" filter | python3 -c '
import json, sys
v = json.load(sys.stdin)["ports"][0]["vlans"]
print("all" if v is None else " ".join(map(str, v)))'
}

# send_tagged VID DST_IP N: N UDP datagrams to the guest's MAC, port 6100, tagged VID,
# written whole to the tap through an AF_PACKET socket (the host needs no 8021q module),
# paced as tap.sh explains.
send_tagged() {
    inns python3 - "$1" "$2" "$3" "$MAC" <<'PY'
import socket, struct, sys, time
vid, dst_ip, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("vtap0", 0))
src_mac = bytes.fromhex(open("/sys/class/net/vtap0/address").read().strip().replace(":", ""))
dst_mac = bytes.fromhex(sys.argv[4].replace(":", ""))
for i in range(n):
    payload = struct.pack("!Q", i) + bytes(192)
    udp = struct.pack("!HHHH", 40000, 6100, 8 + len(payload), 0) + payload
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), i & 0xffff, 0x4000, 64, 17, 0,
                               socket.inet_aton(f"10.{vid}.0.1"), socket.inet_aton(dst_ip)))
    acc = sum(struct.unpack("!10H", bytes(ip)))
    while acc >> 16:
        acc = (acc & 0xffff) + (acc >> 16)
    ip[10:12] = struct.pack("!H", ~acc & 0xffff)
    s.send(dst_mac + src_mac + struct.pack("!HH", 0x8100, vid) + b"\x08\x00" + bytes(ip) + udp)
    time.sleep(0.001)
PY
}

ns=vnic-vlan-$$
make_netns "$ns"
inns() { ip netns exec "$ns" "$@"; }
# The device attachment filters, and so does the net attachment with --qmp (QEMU's table,
# copied); the net attachment without it is the control: QEMU keeps the table and
# vhost-user cannot pass it on, so VLAN 200's frames reach the guest's eth0 there, which
# shows that the counts below would see a leak.
for mode in device net-qmp net; do
    d=d-$mode g=g-$mode qmp=() extra=
    if [[ $mode == net-qmp ]]; then
        qmp=(--qmp "$RUN_DIR/qmp.sock,nic=nic0")
        extra="-qmp unix:$RUN_IN_CHROOT/qmp.sock,server=on,wait=off"
    fi
    start_daemon $d "$ns" --socket "$RUN_DIR/$mode.sock" --tap vtap0 "${qmp[@]}"
    inns ip addr add 10.77.0.1/24 dev vtap0
    inns ip link set vtap0 up
    expect_eq "$mode: before a driver, every VLAN passes" "$(vlans $d)" all
    GUEST_EXTRA_ARGS=$extra start_guest $g ${mode%-qmp} $mode.sock guest 1 $MAC
    wait_console $g "listening 6100" "$GUEST_TIMEOUT" || exit 1
    if [[ $mode == net-qmp ]]; then
        # QEMU's event follows the command; the daemon queries, then applies.
        for _ in $(seq 50); do
            grep -qw 100 <<<"$(vlans $d)" && break
            sleep 0.2
        done
    fi
    table=$(vlans $d)
    log "$mode: VLAN table with eth0.100 up: $table"
    if [[ $mode != net ]]; then
        expect_eq "$mode: VLAN 100 added by the driver" "$(grep -cw 100 <<<"$table")" 1
        expect_eq "$mode: VLAN 200 never added" "$(grep -cw 200 <<<"$table")" 0
    else
        expect_eq "net: QEMU keeps the table, every VLAN passes" "$table" all
    fi
    # The foreign VLAN first, so that the guest's count below is taken after both.
    send_tagged 200 10.200.0.2 $N
    send_tagged 100 10.100.0.2 $N
    wait_console $g "VNIC-VLAN eth0.100 removed" 120 || exit 1
    filtered=$(daemon_counter $d 0 rx_vlan_filtered)
    guest_rx=$(grep -a -o "VNIC-VLAN eth0 rx_packets=[0-9]*" "$RUN_DIR/$g.log" | cut -d= -f2)
    if [[ $mode != net ]]; then
        expect_ge "$mode: VLAN 200's datagrams dropped by the VLAN table" "$filtered" "$N"
        # VLAN 100's N, and the few ARP and IGMP frames around them: none of VLAN 200's.
        expect_le "$mode: frames the guest's eth0 received" "$guest_rx" $((N + 30))
        expect_ge "$mode: frames the guest's eth0 received" "$guest_rx" "$N"
        # The guest printed its line once `ip link del` returned, and Linux sends VLAN_DEL
        # before that returns; the loop absorbs the console's delay (and QMP's).
        for _ in $(seq 50); do
            grep -qw 100 <<<"$(vlans $d)" || break
            sleep 0.2
        done
        expect_eq "$mode: VLAN 100 off the table after VLAN_DEL" "$(grep -cw 100 <<<"$(vlans $d)")" 0
        expect_eq "$mode: no control errors" "$(daemon_counter $d 0 ctrl_errors)" 0
    else
        expect_eq "net: nothing dropped by a VLAN table" "$filtered" 0
        expect_ge "net: frames the guest's eth0 received, VLAN 200's too" "$guest_rx" $((2 * N))
    fi
    inns "$HOST_UDP" send 10.77.0.2 6101 1 64 >/dev/null
    wait_guest $g
    compare_counters $g $d 0
    printf 'REPORT vlan %-6s: %s of %s datagrams on a VLAN the guest did not add dropped; its eth0 received %s frames\n' \
        "$mode" "$filtered" "$N" "$guest_rx" | tee -a "$RUN_DIR/../reports.txt"
    stop_daemon $d
done

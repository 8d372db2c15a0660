#!/usr/bin/env bash
# VLAN filtering (VIRTIO_NET_F_CTRL_VLAN, docs/filter.md). The guest loads 8021q, makes
# eth0.100 (its driver adds VLAN 100 through the control queue) and joins G groups on it.
# The host writes one datagram to each group tagged 200 (a VLAN the guest never added),
# then one to each tagged 100, to the groups' MACs over the tap. The daemon drops VLAN 200's
# (rx_vlan_filtered), so the guest's eth0 never counts them, and the guest's sockets get
# VLAN 100's, every one. Then the guest deletes eth0.100: its driver's VLAN_DEL takes 100
# off the table. In the device attachment, and in the net one with --qmp (QEMU's table,
# copied) and without it (the control, below).
# vnic-kernels: bookworm trixie-bpo
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

G=500
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
vnic-udp recv 6100 $G 120 >/tmp/rx 2>&1 & r=\$!
vnic-mcast ip eth0.100 239.100.0.1 $G 6102 240 >/tmp/m 2>&1 & m=\$!
wait_line /tmp/m VNIC-JOINED || exit 1
echo "VNIC-READY"
wait \$r || { cat /tmp/rx; exit 1; }
grep received /tmp/rx | sed 's/^/VNIC-RX /'
echo "VNIC-VLAN eth0 rx_packets=\$(cat /sys/class/net/eth0/statistics/rx_packets)"
# Its hold ends on a datagram to its port: it leaves the groups.
vnic-udp send 127.0.0.1 6102 1 16 >/dev/null
wait \$m || { cat /tmp/m; exit 1; }
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

# send_tagged VID: one UDP datagram to each of the G groups, port 6100, tagged VID, to the
# group's MAC (RFC 1112), written whole to the tap through an AF_PACKET socket (the host
# needs no 8021q module), paced as tap.sh explains.
send_tagged() {
    inns python3 - "$1" "$G" <<'PY'
import ipaddress, socket, struct, sys, time
vid, n = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("vtap0", 0))
src_mac = bytes.fromhex(open("/sys/class/net/vtap0/address").read().strip().replace(":", ""))
first = int(ipaddress.IPv4Address("239.100.0.1"))
for i in range(n):
    group = (first + i).to_bytes(4, "big")
    dst_mac = bytes([1, 0, 0x5E, group[1] & 0x7F, group[2], group[3]])
    payload = struct.pack("!Q", i) + bytes(56)
    udp = struct.pack("!HHHH", 40000, 6100, 8 + len(payload), 0) + payload
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), i & 0xffff, 0x4000, 1, 17, 0,
                               socket.inet_aton(f"10.{vid}.0.1"), group))
    acc = sum(struct.unpack("!10H", bytes(ip)))
    while acc >> 16:
        acc = (acc & 0xffff) + (acc >> 16)
    ip[10:12] = struct.pack("!H", ~acc & 0xffff)
    s.send(dst_mac + src_mac + struct.pack("!HH", 0x8100, vid) + b"\x08\x00" + bytes(ip) + udp)
    time.sleep(0.001)
PY
}

# groups_in DAEMON: whether the guest's port takes the last group's MAC by its lists or its
# mode (QEMU's table overflows at 64 addresses: allmulti; no driver state: promiscuous).
groups_in() {
    ctl "$1" filter | python3 -c '
import json, sys
p = json.load(sys.stdin)["ports"][0]
m = p["rx_mode"]
sys.exit(0 if m["promisc"] or m["allmulti"] or "01:00:5e:64:01:f4" in p["multicast"] else 1)'
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
    wait_console $g "VNIC-READY" "$GUEST_TIMEOUT" || exit 1
    # The guest's rx-mode update may trail its joins by a moment.
    wait_for 10 "$mode: the groups in the port's filter" groups_in $d || exit 1
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
    send_tagged 200
    send_tagged 100
    wait_console $g "VNIC-VLAN eth0.100 removed" 120 || exit 1
    expect_eq "$mode: the guest's sockets received every group's VLAN 100 datagram" \
        "$(grep -a 'VNIC-RX' "$RUN_DIR/$g.log" | tr -d '\r' | awk '{print $3}')" "$G"
    filtered=$(daemon_counter $d 0 rx_vlan_filtered)
    guest_rx=$(grep -a -o "VNIC-VLAN eth0 rx_packets=[0-9]*" "$RUN_DIR/$g.log" | cut -d= -f2)
    if [[ $mode != net ]]; then
        expect_ge "$mode: VLAN 200's datagrams dropped by the VLAN table" "$filtered" "$G"
        # VLAN 100's G, and the few ARP and IGMP frames around them: none of VLAN 200's.
        expect_le "$mode: frames the guest's eth0 received" "$guest_rx" $((G + 30))
        expect_ge "$mode: frames the guest's eth0 received" "$guest_rx" "$G"
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
        expect_ge "net: frames the guest's eth0 received, VLAN 200's too" "$guest_rx" $((2 * G))
    fi
    inns "$HOST_UDP" send 10.77.0.2 6101 1 64 >/dev/null
    wait_guest $g
    compare_counters $g $d 0
    printf 'REPORT vlan %-7s: %s groups joined on eth0.100; %s of %s datagrams tagged with a VLAN the guest did not add dropped; its eth0 received %s frames\n' \
        "$mode" "$G" "$filtered" "$G" "$guest_rx" | tee -a "$RUN_DIR/../reports.txt"
    stop_daemon $d
done

#!/usr/bin/env bash
# Device reset from the guest, device attachment. The guest joins 100 groups, then unbinds
# its virtio-net driver and binds it again: the virtio core resets the device, QEMU stops
# the rings and starts them from index 0 when the new driver sets DRIVER_OK. Like a NIC
# after a reset, the daemon's filter must then be back to promiscuous with empty tables
# (checked while the new interface is still down, so the driver has sent nothing yet);
# once the interface is up, the table must equal the guest's dev_mcast again, traffic must
# flow, and no control command may have been refused (none was posted before DRIVER_OK).
# vnic-kernels: bookworm trixie-bpo
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

make_initrd reset <<'GUEST'
wait_carrier eth0 || exit 1
vnic-mcast ip eth0 239.9.0.1 100 7003 600 >/tmp/m 2>&1 & m=$!
wait_line /tmp/m VNIC-JOINED || { cat /tmp/m; exit 1; }
ip addr add 10.44.0.2/24 dev eth0
vnic-udp recv 7011 1 120 >/dev/null & n=$!
echo "VNIC-HELD $(mcast_snapshot eth0)"
wait $n || exit 1
dev=$(basename "$(readlink /sys/class/net/eth0/device)")
echo "$dev" >/sys/bus/virtio/drivers/virtio_net/unbind || exit 1
# Only now: leaving before the unbind would empty the table without any reset.
kill $m 2>/dev/null
echo "$dev" >/sys/bus/virtio/drivers/virtio_net/bind || exit 1
echo "VNIC-REBOUND"
# The host looks at the daemon's filter in this window, while eth0 is down.
sleep 8
echo "VNIC-UP"
wait_carrier eth0 || exit 1
ip addr add 10.44.0.2/24 dev eth0
i=0
until ping -c 1 -W 1 10.44.0.1 >/dev/null 2>&1; do i=$((i + 1)); [ $i -gt 10 ] && exit 1; done
# Stay until the host has compared (QEMU leaving would reset the port again).
vnic-udp recv 7011 1 120 >/dev/null & n=$!
echo "VNIC-BASE $(mcast_snapshot eth0)"
wait $n || exit 1
GUEST

ns=vnic-reset-$$
make_netns "$ns"
start_daemon d "$ns" --socket "$RUN_DIR/d.sock" --tap vtap0
ip netns exec "$ns" ip addr add 10.44.0.1/24 dev vtap0
ip netns exec "$ns" ip link set vtap0 up
start_guest g device d.sock reset

console() { tr -d '\r' <"$RUN_DIR/g.log"; }
# rx_state: "promisc multicast-count" of port 0 in `ctl filter`.
rx_state() {
    ctl d filter | python3 -c '
import json, sys
p = json.load(sys.stdin)["ports"][0]
print(str(p["rx_mode"]["promisc"]).lower(), len(p["multicast"]))'
}

wait_console g "VNIC-HELD " "$GUEST_TIMEOUT" || exit 1
read -r _ gdig gcount < <(console | grep -a "VNIC-HELD ")
converge_mcast d "daemon table = guest dev_mcast while 100 groups are held ($gcount entries)" "$gdig"
expect_eq "rx mode and table size before the reset" "$(rx_state)" "false $gcount"
ip netns exec "$ns" "$HOST_UDP" send 10.44.0.2 7011 1 16 >/dev/null

wait_console g "VNIC-REBOUND" 60 || exit 1
state=$(rx_state)
# The window is only valid if the guest had not brought eth0 up yet.
console | grep -aq "VNIC-UP" && die "looked at the filter too late: the guest was already up"
expect_eq "rx mode and table size after the reset, before the new driver programs it" "$state" "true 0"

wait_console g "VNIC-BASE " 60 || exit 1
read -r _ gdig gcount < <(console | grep -a "VNIC-BASE ")
converge_mcast d "daemon table = guest dev_mcast after the reset ($gcount entries)" "$gdig"
expect_eq "rx mode after the new driver's commands" "$(rx_state | cut -d' ' -f1)" false
ip netns exec "$ns" "$HOST_UDP" send 10.44.0.2 7011 1 16 >/dev/null
wait_guest g
expect_eq "control commands refused" "$(daemon_counter d 0 ctrl_errors)" 0
expect_eq "control commands posted before DRIVER_OK" "$(daemon_counter d 0 ctrl_before_driver_ok)" 0

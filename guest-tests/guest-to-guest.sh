#!/usr/bin/env bash
# Two guests on one daemon talk through its learning switch, no tap: one in the net
# attachment, one in the device attachment. Ping and 300 counted UDP datagrams each way;
# each port's counters equal its guest's.
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

N=300
# guest_script SELF PEER: receive from the peer in the background before the link is up (so
# nothing the peer sends can arrive before the socket exists), reach the peer, send to it.
guest_script() {
    cat <<GUEST
vnic-udp recv 5003 $N 120 >/tmp/recv.txt & rp=\$!
vnic-udp recv 5004 1 180 >/tmp/done.txt & dp=\$!
wait_carrier eth0 || exit 1
ip addr add 10.88.0.$1/24 dev eth0
i=0
until ping -c 1 -W 1 10.88.0.$2 >/dev/null 2>&1; do i=\$((i + 1)); [ \$i -gt 90 ] && exit 1; done
ping -c 5 -W 2 10.88.0.$2 | tail -2
vnic-udp send 10.88.0.$2 5003 $N 200 1000 || exit 1
wait \$rp; r=\$?; cat /tmp/recv.txt; [ \$r = 0 ] || exit 1
# Tell the peer we are done, and wait for its word, so neither reads its counters while
# the other still sends.
vnic-udp send 10.88.0.$2 5004 1 64 || exit 1
wait \$dp || exit 1
report_stats eth0
GUEST
}
guest_script 1 2 | make_initrd a
guest_script 2 1 | make_initrd b

start_daemon sw - --socket "$RUN_DIR/a.sock" --socket "$RUN_DIR/b.sock"
start_guest ga net a.sock a 1 52:54:00:d0:aa:01
start_guest gb device b.sock b
wait_guest ga
wait_guest gb
compare_counters ga sw 0
compare_counters gb sw 1
expect_eq "port 0 after its guest left" "$(daemon_counter sw 0 connected)" False

#!/usr/bin/env bash
# Two guests on one daemon talk through its learning switch, no tap: one in the net
# attachment, one in the device attachment. Ping and 300 counted UDP datagrams each way;
# each port's counters equal its guest's.
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

N=300
# guest_script SELF PEER: listen for the peer, reach it, exchange N datagrams each way.
guest_script() {
    cat <<GUEST
peer_listen $N
wait_carrier eth0 || exit 1
ip addr add 10.88.0.$1/24 dev eth0
retry 90 ping -c 1 -W 1 10.88.0.$2 || exit 1
ping -c 5 -W 2 10.88.0.$2 | tail -2
peer_exchange 10.88.0.$2 $N || exit 1
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

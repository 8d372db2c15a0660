#!/usr/bin/env bash
# Two guests on one daemon talk through its learning switch, no tap: one in the net
# attachment, one in the device attachment. Ping and 300 counted UDP datagrams each way;
# each port's counters equal its guest's.
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

N=300
pair_script 10.88.0 1 2 $N | make_initrd a
pair_script 10.88.0 2 1 $N | make_initrd b

start_daemon sw - --socket "$RUN_DIR/a.sock" --socket "$RUN_DIR/b.sock"
start_guest ga net a.sock a 1 52:54:00:d0:aa:01
start_guest gb device b.sock b
wait_guest ga
wait_guest gb
compare_counters ga sw 0
compare_counters gb sw 1
expect_eq "port 0 after its guest left" "$(daemon_counter sw 0 connected)" False

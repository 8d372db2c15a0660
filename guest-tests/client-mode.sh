#!/usr/bin/env bash
# --client: QEMU owns both vhost-user sockets (`-chardev socket,server=on`), as libvirt may
# want, and the daemon connects to them. The daemon starts first and waits for the sockets;
# two guests (net and device attachment) then ping each other and exchange counted UDP
# datagrams through its switch, and each port's counters equal its guest's. The daemon
# stops cleanly while it waits to connect again.
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

N=100
pair_script 10.89.0 1 2 $N | make_initrd a
pair_script 10.89.0 2 1 $N | make_initrd b

start_daemon sw - --client --socket-path "$RUN_DIR/a.sock" --socket-path "$RUN_DIR/b.sock"
expect_eq "port 0 before QEMU listens" "$(daemon_counter sw 0 connected)" False
start_guest ga net a.sock a 1 52:54:00:d0:aa:01 ,server=on
start_guest gb device b.sock b 1 52:54:00:d0:aa:02 ,server=on
wait_guest ga
wait_guest gb
compare_counters ga sw 0
compare_counters gb sw 1
grep -a -q "port 0: waiting for a frontend to listen at" "$RUN_DIR/sw.log" \
    || die "the daemon did not say it waits for the frontend's socket"
stop_daemon sw
log "client mode: both guests served over sockets QEMU listened on"

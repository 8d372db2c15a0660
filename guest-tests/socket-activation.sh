#!/usr/bin/env bash
# Socket activation as systemd does it (scripts/systemd/dpaa-vnic@.socket), with systemd's
# own tool: systemd-socket-activate binds and listens on both vhost-user sockets, and
# starts the daemon only when the first QEMU connects, handing the sockets over as
# descriptors 3 and 4 (LISTEN_FDS). The daemon serves them through --fd 3 --fd 4; two
# guests (net and device attachment) exchange counted datagrams; after SIGTERM the socket
# files are still there, since the daemon did not make them.
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run
command -v systemd-socket-activate >/dev/null || die "systemd-socket-activate missing (Debian's systemd package)"

N=100
pair_script 10.90.0 1 2 $N | make_initrd a
pair_script 10.90.0 2 1 $N | make_initrd b

# Without --accept, the activator execs the daemon in its own process on the first
# connection: the PID recorded here is the daemon's.
systemd-socket-activate -l "$RUN_DIR/a.sock" -l "$RUN_DIR/b.sock" -E RUST_LOG=info \
    "$VNIC_BIN" --fd 3 --fd 4 --control "$RUN_DIR/sw.ctl" >>"$RUN_DIR/sw.log" 2>&1 &
pid=$!
PIDS+=("$pid")
DAEMON_PID[sw]=$pid
wait_for 10 "the activator's sockets" test -S "$RUN_DIR/b.sock" || die "no sockets"
sleep 0.5
[[ ! -S $RUN_DIR/sw.ctl ]] || die "the daemon started before any frontend connected"
start_guest ga net a.sock a 1 52:54:00:d0:aa:01
wait_for 30 "daemon sw control socket" "$VNIC_BIN" ctl --control "$RUN_DIR/sw.ctl" stats \
    || die "the daemon was not started by the first connection"
start_guest gb device b.sock b 1 52:54:00:d0:aa:02
wait_guest ga
wait_guest gb
compare_counters ga sw 0
compare_counters gb sw 1
stop_daemon sw
[[ -S $RUN_DIR/a.sock && -S $RUN_DIR/b.sock ]] || die "the daemon removed sockets it did not make"
log "socket activation: the daemon started on the first connection and served both inherited sockets"

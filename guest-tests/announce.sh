#!/usr/bin/env bash
# Announce and link state through QEMU (net attachment, --snoop with --qmp).
# (1) A guest holds 10 000 groups; the daemon restarts under it (QEMU reconnects). The new
#     daemon's snooper is empty, and stays so: nothing makes the guest report again. After
#     `ctl announce 0` (QMP announce-self: VIRTIO_NET_S_ANNOUNCE, then Linux's
#     NETDEV_RESEND_IGMP, a report per group) the snooped table equals the guest's
#     dev_mcast within 2 s; the few reports Linux's queue drops from that burst are found by
#     the audit that follows it.
# (2) `ctl link 0 down`: the guest's carrier reads 0 and datagrams the host sends meanwhile
#     never reach it; `ctl link 0 up`: the carrier is back, and so is traffic.
# (3) The device attachment, where the port serves the config space itself and tells QEMU
#     of a change over the channel QEMU gave (VHOST_USER_BACKEND_CONFIG_CHANGE_MSG): after
#     `ctl announce 0` the guest sends a gratuitous ARP and its IGMP reports (seen by `ctl
#     capture`) and acks on its control queue; then (2) again.
# vnic-kernels: bookworm trixie-bpo
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

GROUPS_HELD=${VNIC_ANNOUNCE_GROUPS:-10000}

# guest_script GROUPS: hold GROUPS groups, say so, then follow the link phase.
guest_script() {
    cat <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.77.0.2/24 dev eth0
vnic-mcast ip eth0 239.77.0.1 $1 7077 900 >/tmp/m 2>&1 & m=\$!
wait_line /tmp/m VNIC-JOINED 3000 || exit 1
# The list settles (Linux applies it from deferred work) before the host compares.
prev=""; cur=\$(mcast_snapshot eth0); i=0
until [ "\$cur" = "\$prev" ] || [ \$i -gt 10 ]; do prev=\$cur; sleep 1; cur=\$(mcast_snapshot eth0); i=\$((i + 1)); done
echo "VNIC-HELD \$(mcast_snapshot eth0)"
# The host says when the link phase begins (the daemon's restart flaps the carrier too).
vnic-udp recv 7078 1 600 >/dev/null || exit 1
udp_seen() { awk '/^Udp: [0-9]/ {print \$2 + \$3}' /proc/net/snmp; }
i=0
until [ "\$(cat /sys/class/net/eth0/carrier)" = 0 ]; do i=\$((i + 1)); [ \$i -gt 600 ] && exit 1; sleep 0.1; done
before=\$(udp_seen)
echo "VNIC-CARRIER 0"
i=0
until [ "\$(cat /sys/class/net/eth0/carrier)" = 1 ]; do i=\$((i + 1)); [ \$i -gt 600 ] && exit 1; sleep 0.1; done
# Anything the daemon had written to the ring would be read by now.
sleep 1
echo "VNIC-UP udp_while_down=\$((\$(udp_seen) - before))"
vnic-udp recv 7079 1 60 | grep received | sed 's/^/VNIC-BACK /'
wait \$m || { cat /tmp/m; exit 1; }
GUEST
}
guest_script "$GROUPS_HELD" | make_initrd announce
guest_script 3 | make_initrd announce-dev

ns=vnic-an-$$
make_netns "$ns"
daemon_args=(--socket "$RUN_DIR/p.sock" --tap vtap0 --snoop --qmp "$RUN_DIR/qmp.sock,nic=nic0")
tap_up() {
    ip netns exec "$ns" ip addr add 10.77.0.1/24 dev vtap0
    ip netns exec "$ns" ip link set vtap0 up
    # No ARP while the link is down: the host's datagrams must reach the port to be dropped.
    ip netns exec "$ns" ip neigh replace 10.77.0.2 lladdr 52:54:00:d0:aa:01 dev vtap0
}
send() { ip netns exec "$ns" "$HOST_UDP" send 10.77.0.2 "$@" >/dev/null; }
snooped() { ctl "$1" filter | python3 -c 'import json,sys; print(json.load(sys.stdin)["ports"][0]["snooped_groups"])'; }
console() { tr -d '\r' <"$RUN_DIR/${1:-g}.log"; }

start_daemon d1 "$ns" "${daemon_args[@]}"
tap_up
GUEST_EXTRA_ARGS="-qmp unix:$RUN_IN_CHROOT/qmp.sock,server=on,wait=off" \
    start_guest g net p.sock announce 1 52:54:00:d0:aa:01 ",reconnect-ms=500"
wait_console g "VNIC-HELD " "$GUEST_TIMEOUT" || exit 1
read -r _ gdig gcount < <(console | grep -a "VNIC-HELD ")
converge_mcast d1 "before the restart: snooped table = guest dev_mcast ($gcount entries)" "$gdig"

# --- (1) restart, then announce -------------------------------------------------------------
stop_daemon d1
start_daemon d2 "$ns" "${daemon_args[@]}"
tap_up
wait_for 30 "QEMU to reconnect" bash -c "[[ \$('$VNIC_BIN' ctl --control '$RUN_DIR/d2.ctl' stats | grep -c '\"connected\": true') == 2 ]]" || exit 1
# The control: 3 s after the reconnect the snooper still lacks the groups.
sleep 3
expect_le "after the restart, before an announce: groups snooped" "$(snooped d2)" $((GROUPS_HELD / 100))
# The follower reconnects to QEMU's monitor once the old daemon's connection is gone
# (`ctl info` says so, and names the NIC it follows; nothing is sent to QEMU to find out).
qmp_ready() { ctl d2 info | python3 -c 'import json,sys; q=json.load(sys.stdin)["ports"][0]["qmp"]; sys.exit(not (q["connected"] and q["nic"] == "nic0"))'; }
wait_for 30 "the QMP follower to be back" qmp_ready || exit 1
t0=$(date +%s.%N)
ctl d2 announce 0 >/dev/null
got=""
for _ in $(seq 100); do
    read -r got DCOUNT < <(daemon_mcast_digest d2)
    [[ $got == "$gdig" ]] && break
    sleep 0.05
done
took=$(elapsed_since "$t0")
expect_eq "after ctl announce: snooped table = guest dev_mcast (daemon has $DCOUNT)" "$got" "$gdig"
expect_le "seconds from ctl announce to the whole table" "$took" 2
# The announce, not the audit, brought the groups: a report per group (the audit's answers
# pack hundreds of groups in one). Linux's own queue drops a few of those back-to-back
# reports; the audit that follows them finds those.
sleep 2
read -r reports added < <(ctl d2 stats | python3 -c 'import json,sys; s=json.load(sys.stdin)["ports"][0]["snoop"]; print(s["reports"]["igmp"], s["audit_added"])')
expect_ge "IGMP reports the guest sent on the announce" "$reports" $((GROUPS_HELD * 9 / 10))
log "groups the guest's announce lost and the audit after it found: $added"
printf 'REPORT announce: %s groups snooped again %s s after ctl announce (daemon restarted; %s lost by the guest, found by the audit; %s)\n' \
    "$gcount" "$took" "$added" "$(cat "$GUEST_DIR/kernel-package")" | tee -a "$RUN_DIR/../reports.txt"

# link_phase DAEMON GUEST: (2) on that daemon's port 0 and that guest.
link_phase() {
    local d=$1 g=$2
    send 7078 1 16
    ctl "$d" link 0 down >/dev/null
    wait_console "$g" "VNIC-CARRIER 0" 60 || exit 1
    log "ok: $g's carrier went down"
    [[ $g == g3 ]] && expect_eq "device: the link as served (ctl filter)" "$(status)" "False False"
    send 7080 20 64 200
    sleep 1
    ctl "$d" link 0 up >/dev/null
    wait_console "$g" "VNIC-UP " 60 || exit 1
    expect_eq "$g: datagrams that reached the guest while its link was down" \
        "$(console "$g" | grep -a -o 'udp_while_down=[0-9]*' | cut -d= -f2)" 0
    for _ in $(seq 60); do
        console "$g" | grep -q -a "VNIC-BACK" && break
        send 7079 1 16
        sleep 0.5
    done
    expect_eq "$g: after the link came up, the guest receives again" \
        "$(console "$g" | grep -a 'VNIC-BACK' | awk '{print $3}')" 1
    send 7077 1 16
    wait_guest "$g"
}

# --- (2) link down and up -------------------------------------------------------------------
link_phase d2 g
stop_daemon d2

# --- (3) the device attachment ------------------------------------------------------------
ns=vnic-an3-$$
make_netns "$ns"
start_daemon d3 "$ns" --socket "$RUN_DIR/p3.sock" --tap vtap0
tap_up
start_guest g3 device p3.sock announce-dev 1 52:54:00:d0:aa:01
wait_console g3 "VNIC-HELD " "$GUEST_TIMEOUT" || exit 1
acks=$(daemon_counter d3 0 ctrl_commands)
errors=$(daemon_counter d3 0 ctrl_errors)
ctl d3 capture 0 "$RUN_DIR/announce3.pcapng" --direction tx --seconds 4 2>/dev/null &
capture=$!
PIDS+=("$capture")
sleep 0.5
ctl d3 announce 0 >/dev/null
wait "$capture"
# A gratuitous ARP names the guest as both sender and target.
expect_ge "device: gratuitous ARPs the guest sent on the announce" \
    "$(tcpdump -nr "$RUN_DIR/announce3.pcapng" 'arp and arp[14:4] = arp[24:4]' 2>/dev/null | wc -l)" 1
expect_ge "device: IGMP reports the guest sent on the announce" \
    "$(tcpdump -nr "$RUN_DIR/announce3.pcapng" igmp 2>/dev/null | wc -l)" 1
# The driver acked the announce on its control queue, which cleared the status bit.
status() { ctl d3 filter | python3 -c 'import json,sys; p=json.load(sys.stdin)["ports"][0]; print(p["link_up"], p["announcing"])'; }
expect_eq "device: link up, announce acked (ctl filter)" "$(status)" "True False"
expect_ge "device: control commands (the driver's ANNOUNCE_ACK)" "$(daemon_counter d3 0 ctrl_commands)" $((acks + 1))
expect_eq "device: control commands refused" "$(daemon_counter d3 0 ctrl_errors)" "$errors"
link_phase d3 g3
stop_daemon d3


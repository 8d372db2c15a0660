#!/usr/bin/env bash
# Checksum offload and checksum actions end to end, guest (net attachment) to a host socket
# behind a tap started with --tap-csum off.
#  0. The guest sends UDP through its stack with checksum offload on (partial checksums in
#     the virtio header): dpaa-vnic completes each one on the way into the tap, and every
#     datagram arrives with a valid checksum (Udp InCsumErrors unchanged).
# Then hand-built IPv4/UDP frames with wrong checksums (IP options, odd and even lengths):
#  1. No action: the host's stack drops every one (Ip InHdrErrors, Udp InCsumErrors).
#  2. `ctl action add port=1,dir=egress,update=iph+udp` while the daemon runs: every
#     datagram arrives, counted as csum_updated on the tap; frames whose IP total length
#     lies are dropped by the action and counted as csum_failed, as act_csum would; the
#     action's own counters (ctl action list) say the same: every lying frame dropped, the
#     rest it matched passed.
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

N=200
M=50
make_initrd guest <<GUEST
wait_carrier eth0 || { echo "VNIC: no carrier"; exit 1; }
ip addr add 10.77.0.2/24 dev eth0
ping -c 2 -W 3 10.77.0.1 >/dev/null || exit 1
mac=\$(awk '\$1 == "10.77.0.1" {print \$4}' /proc/net/arp)
echo "host mac \$mac"
vnic-udp send 10.77.0.1 5003 $N 333 1000 || exit 1
vnic-raw eth0 "\$mac" 10.77.0.2 10.77.0.1 5004 $N broken || exit 1
echo "VNIC-PHASE1-SENT"
# The host answers on 5005 once the action is in place.
vnic-udp recv 5005 1 300 || exit 1
vnic-raw eth0 "\$mac" 10.77.0.2 10.77.0.1 5006 $N broken || exit 1
vnic-raw eth0 "\$mac" 10.77.0.2 10.77.0.1 5006 $M lying || exit 1
echo "VNIC-PHASE2-SENT"
report_stats eth0
GUEST

# snmp NS TABLE FIELD: a counter of the namespace's /proc/net/snmp.
snmp() {
    ip netns exec "$1" awk -v t="$2:" -v f="$3" \
        '$1 == t && !h { for (i = 2; i <= NF; i++) k[i] = $i; h = 1; next }
         $1 == t && h { for (i = 2; i <= NF; i++) if (k[i] == f) print $i }' /proc/net/snmp
}

ns=vnic-csum-$$
make_netns "$ns"
start_daemon d "$ns" --socket "$RUN_DIR/g.sock" --tap vtap0 --tap-csum off
ip netns exec "$ns" ip addr add 10.77.0.1/24 dev vtap0
ip netns exec "$ns" ip link set vtap0 up
hdr0=$(snmp "$ns" Ip InHdrErrors)
csum0=$(snmp "$ns" Udp InCsumErrors)
ip netns exec "$ns" "$HOST_UDP" recv 5003 $N 120 >"$RUN_DIR/host-offload.log" 2>&1 &
offrecv=$!
PIDS+=("$offrecv")
wait_for 10 "host receiver" grep -q "listening 5003" "$RUN_DIR/host-offload.log"
start_guest g net g.sock guest
wait_console g "VNIC-PHASE1-SENT" "$GUEST_TIMEOUT" || exit 1
wait "$offrecv" || { log "offloaded sends: host got $(cat "$RUN_DIR/host-offload.log")"; exit 1; }
expect_eq "offload: host received" "$(grep '^received' "$RUN_DIR/host-offload.log")" "received $N"
expect_eq "offload: partial checksums completed for the tap" "$(daemon_counter d 1 tx_csum_completed)" "$N"
# Even frames have a bad IP header checksum, odd ones only a bad UDP checksum.
deadline=$((SECONDS + 30))
while (($(snmp "$ns" Ip InHdrErrors) - hdr0 < N / 2 || $(snmp "$ns" Udp InCsumErrors) - csum0 < N / 2)); do
    ((SECONDS < deadline)) || break
    sleep 0.2
done
expect_eq "no action: Ip InHdrErrors delta" "$(($(snmp "$ns" Ip InHdrErrors) - hdr0))" "$((N / 2))"
expect_eq "no action: Udp InCsumErrors delta" "$(($(snmp "$ns" Udp InCsumErrors) - csum0))" "$((N / 2))"
expect_eq "no action: csum_updated on the tap" "$(daemon_counter d 1 csum_updated)" 0

ctl d action add port=1,dir=egress,update=iph+udp >/dev/null
expect_eq "actions after ctl add" "$(ctl d action list | python3 -c 'import json,sys; print(json.load(sys.stdin)["actions"])')" \
    "['port=1,dir=egress,update=iph+udp']"
ip netns exec "$ns" "$HOST_UDP" recv 5006 $N 120 >"$RUN_DIR/host-recv.log" 2>&1 &
hostrecv=$!
PIDS+=("$hostrecv")
wait_for 10 "host receiver" grep -q "listening 5006" "$RUN_DIR/host-recv.log"
hdr1=$(snmp "$ns" Ip InHdrErrors)
csum1=$(snmp "$ns" Udp InCsumErrors)
ip netns exec "$ns" "$HOST_UDP" send 10.77.0.2 5005 1 >/dev/null
wait_console g "VNIC-PHASE2-SENT" 120 || exit 1
wait "$hostrecv" || { log "host received fewer than $N: $(cat "$RUN_DIR/host-recv.log")"; exit 1; }
wait_guest g
expect_eq "action: host received" "$(grep '^received' "$RUN_DIR/host-recv.log")" "received $N"
expect_eq "action: csum_updated on the tap" "$(daemon_counter d 1 csum_updated)" "$N"
expect_eq "action: csum_failed (lying total length)" "$(daemon_counter d 1 csum_failed)" "$M"
expect_eq "action: Ip InHdrErrors delta" "$(($(snmp "$ns" Ip InHdrErrors) - hdr1))" 0
expect_eq "action: Udp InCsumErrors delta" "$(($(snmp "$ns" Udp InCsumErrors) - csum1))" 0
# The action's own counts: the lying frames dropped, every other frame it matched passed
# (the broken datagrams, and whatever IP the guest's stack sent meanwhile).
read -r matched passed dropped < <(ctl d action list | python3 -c '
import json, sys
c = json.load(sys.stdin)["counts"][0]
print(c["matched"], c["passed"], c["dropped"])')
expect_eq "action list: frames the action dropped" "$dropped" "$M"
expect_ge "action list: frames it passed" "$passed" "$N"
expect_eq "action list: matched = passed + dropped" "$matched" "$((passed + dropped))"
# Frames the action dropped never reached the tap.
expect_eq "guest tx = tap tx + dropped by the action" \
    "$(daemon_counter d 0 tx_packets)" "$(($(daemon_counter d 1 tx_packets) + M))"
printf 'REPORT csum-action %d broken frames repaired, %d lying frames dropped\n' "$N" "$M" \
    | tee -a "$RUN_DIR/../reports.txt"
stop_daemon d

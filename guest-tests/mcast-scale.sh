#!/usr/bin/env bash
# Thousands of memberships in a guest in the device attachment, every join API: the daemon's
# multicast table must equal the guest's /proc/net/dev_mcast while the groups are held and
# after they are left, and the filter must have done exactly one add per join and one remove
# per leave (incremental sync: a rebuild would do about N^2/2). Join and leave times per
# batch of 500 go to the report.
# Cases: "MODE FIRST_GROUP COUNT [SOURCES]"; VNIC_SCALE_CASES overrides.
# vnic-kernels: bookworm trixie-bpo
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

CASES=${VNIC_SCALE_CASES:-"ip 239.1.0.1 2000;group 239.2.0.1 2000;source 239.3.0.1 2000 4;ipv6 ff15::1:0 2000;ip 239.4.0.1 10000"}
FILTER=${VNIC_SCALE_FILTER:-memac}
ATTACH=${VNIC_SCALE_ATTACH:-device}
# Seconds to keep the groups before checking again (for --snoop-timeout: only the querier's
# refreshes keep them then).
HOLD=${VNIC_SCALE_HOLD_S:-0}
read -ra DAEMON_ARGS <<<"${VNIC_SCALE_DAEMON_ARGS:-}"
IFS=';' read -ra case_list <<<"$CASES"

make_initrd scale <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.33.0.2/24 dev eth0
echo 0 > /proc/sys/net/ipv6/conf/all/disable_ipv6
echo 0 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6
# IPv6 joins its link-local groups from deferred work: wait until the list stops changing.
i=0
until ip -6 addr show dev eth0 | grep -q fe80; do i=\$((i + 1)); [ \$i -gt 100 ] && break; sleep 0.1; done
prev=""; cur=\$(mcast_snapshot eth0); i=0
until [ "\$cur" = "\$prev" ] || [ \$i -gt 10 ]; do prev=\$cur; sleep 1; cur=\$(mcast_snapshot eth0); i=\$((i + 1)); done
# Case 0: the base set (all-hosts, IPv6 all-nodes, ...) settles before any join is counted.
vnic-udp recv 7011 1 120 >/dev/null & n=\$!
echo "VNIC-BASE case=0 \$(mcast_snapshot eth0)"
wait \$n || exit 1
k=0
for c in $(printf '"%s" ' "${case_list[@]}"); do
    k=\$((k + 1))
    set -- \$c
    vnic-mcast \$1 eth0 \$2 \$3 7010 600 \${4:-4} >/tmp/out.\$k 2>&1 & p=\$!
    i=0
    until grep -q VNIC-JOINED /tmp/out.\$k; do
        i=\$((i + 1)); [ \$i -gt 6000 ] && { cat /tmp/out.\$k; exit 1; }
        kill -0 \$p 2>/dev/null || { cat /tmp/out.\$k; exit 1; }
        sleep 0.1
    done
    sed "s/^VNIC-TIME /VNIC-TIME case=\$k /" /tmp/out.\$k
    echo "VNIC-HELD case=\$k \$(mcast_snapshot eth0)"
    wait \$p || { cat /tmp/out.\$k; exit 1; }
    grep -E "leave|LEFT" /tmp/out.\$k | sed "s/^VNIC-TIME /VNIC-TIME case=\$k /"
    vnic-udp recv 7011 1 120 >/dev/null & n=\$!
    echo "VNIC-BASE case=\$k \$(mcast_snapshot eth0)"
    wait \$n || exit 1
done
report_stats eth0
GUEST

ns=vnic-scale-$$
make_netns "$ns"
start_daemon d "$ns" --socket "$RUN_DIR/d.sock" --tap vtap0 --filter "$FILTER" "${DAEMON_ARGS[@]}"
ip netns exec "$ns" ip addr add 10.33.0.1/24 dev vtap0
ip netns exec "$ns" ip link set vtap0 up
start_guest g "$ATTACH" d.sock scale

console() { tr -d '\r' <"$RUN_DIR/g.log"; }

wait_console g "VNIC-BASE case=0 " "$GUEST_TIMEOUT" || exit 1
read -r _ _ gdig gcount < <(console | grep -a "VNIC-BASE case=0 ")
converge_mcast d "base set before any join ($gcount entries)" "$gdig"
adds0=$(daemon_counter d 0 filter_adds)
removes0=$(daemon_counter d 0 filter_removes)
ip netns exec "$ns" "$HOST_UDP" send 10.33.0.2 7011 1 16 >/dev/null
k=0
for c in "${case_list[@]}"; do
    k=$((k + 1))
    read -r mode first n _ <<<"$c"
    wait_console g "VNIC-HELD case=$k " "$GUEST_TIMEOUT" || exit 1
    read -r _ _ gdig gcount < <(console | grep -a "VNIC-HELD case=$k ")
    converge_mcast d "case $k ($mode x$n): daemon table = guest dev_mcast while held ($gcount entries)" "$gdig"
    expect_ge "case $k: entries held" "$DCOUNT" "$n"
    expect_eq "case $k: filter adds for $n joins" "$(($(daemon_counter d 0 filter_adds) - adds0))" "$n"
    if ((HOLD > 0)); then
        sleep "$HOLD"
        converge_mcast d "case $k: daemon table = guest dev_mcast still, after $HOLD s held" "$gdig"
    fi
    ip netns exec "$ns" "$HOST_UDP" send 10.33.0.2 7010 1 16 >/dev/null
    wait_console g "VNIC-BASE case=$k " "$GUEST_TIMEOUT" || exit 1
    read -r _ _ gdig gcount < <(console | grep -a "VNIC-BASE case=$k ")
    converge_mcast d "case $k: daemon table = guest dev_mcast after leaving ($gcount entries)" "$gdig"
    expect_eq "case $k: filter removes for $n leaves" "$(($(daemon_counter d 0 filter_removes) - removes0))" "$n"
    join_ms=$(console | grep -a "VNIC-TIME case=$k join total" | sed 's/.*ms=//')
    leave_ms=$(console | grep -a "VNIC-TIME case=$k leave total" | sed 's/.*ms=//')
    batches=$(console | grep -a "VNIC-TIME case=$k join batch_end" | sed 's/.*ms=//' | tr '\n' ' ')
    printf 'REPORT %s %-6s x%-5s %s attachment%s, %s filter, %s: join %s ms, leave %s ms; join per 500: %s\n' \
        "$TEST_NAME" "$mode" "$n" "$ATTACH" "${DAEMON_ARGS[*]:+ ${DAEMON_ARGS[*]}}" "$FILTER" "$(cat "$GUEST_DIR/kernel-package")" "$join_ms" "$leave_ms" "$batches" \
        | tee -a "$RUN_DIR/../reports.txt"
    adds0=$(daemon_counter d 0 filter_adds)
    removes0=$(daemon_counter d 0 filter_removes)
    ip netns exec "$ns" "$HOST_UDP" send 10.33.0.2 7011 1 16 >/dev/null
done
wait_guest g
if [[ " ${DAEMON_ARGS[*]} " == *" --snoop-timeout "* ]]; then
    # The querier sends a query a second until the guest is gone.
    compare_counters_within g d 0 8
elif [[ " ${DAEMON_ARGS[*]} " == *" --snoop "* ]]; then
    # An audit (two queries, and the guest's answers) may follow the guest's last look at
    # its counters by a second or two (docs/filter.md).
    compare_counters_within g d 0 8
else
    compare_counters g d 0
fi
expect_eq "control commands refused" "$(daemon_counter d 0 ctrl_errors)" 0

#!/usr/bin/env bash
# Multicast churn on one daemon: several guests at once, each on its own port, each running
# vnic-churn (threads joining and leaving at random through every socket API, a seed for
# all of it). At every checkpoint all guests pause, and scripts/churn-check, which only
# observes, measures how long each port's table took after the guest's last change to
# become what the guest's state says (dev_mcast; for a snooped port, what its sockets
# want), and compares the bucket reference counts with an independent model of the FMan
# hashes, the filter counters with the table, and the traffic each port lets through with
# what its filter predicts. After the last operations one checkpoint holds every socket
# open, and the last comes after every socket is closed.
#
# Settings (environment):
#   VNIC_CHURN_SEED        the seed (default: drawn and printed; replays a run)
#   VNIC_CHURN_GUESTS      one word per guest port: device (control queue), snoop (net
#                          attachment, daemon --snoop), qmp (net attachment, daemon --qmp;
#                          not with snoop in the same run). Default "device snoop".
#   VNIC_CHURN_THREADS, VNIC_CHURN_OPS (per thread), VNIC_CHURN_CHECKPOINTS, VNIC_CHURN_POOL
#   VNIC_CHURN_KNOBS       words: versions (force_igmp_version 2/3 and force_mld_version 1/2
#                          switched every 20 ms while the guest churns, the protocol's own
#                          choice at checkpoints), maxmem (igmp_max_memberships 8: joins
#                          past it fail with ENOBUFS), optmem (net.core.optmem_max left at
#                          its default), querier (daemon --snoop-timeout 6: groups kept only
#                          by the answers to its queries)
#   VNIC_CHURN_FILTER      memac (default), dtsec, dtsec-ext, exact
#   VNIC_CHURN_CONVERGE    "median worst" seconds the tables must be exact within after a
#                          guest's last change (default "2 3")
# Ends with a "REPORT churn ..." line: operations per second, filter syncs and control
# commands per second, the daemon's CPU share, how long the tables took to be exact
# (median, p95, worst), checkpoints passed and divergences.
# vnic-kernels: bookworm trixie-bpo
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

SEED=${VNIC_CHURN_SEED:-$(od -An -N6 -tu8 /dev/urandom | tr -d ' ')}
read -ra GUESTS <<<"${VNIC_CHURN_GUESTS:-device snoop}"
THREADS=${VNIC_CHURN_THREADS:-3}
OPS=${VNIC_CHURN_OPS:-400}
CHECKPOINTS=${VNIC_CHURN_CHECKPOINTS:-3}
POOL=${VNIC_CHURN_POOL:-48}
KNOBS=" ${VNIC_CHURN_KNOBS:-} "
FILTER=${VNIC_CHURN_FILTER:-memac}
log "churn seed $SEED (VNIC_CHURN_SEED=$SEED replays it): guests ${GUESTS[*]}, $THREADS threads x $OPS operations, $CHECKPOINTS checkpoints, pool $POOL, knobs:${KNOBS}filter $FILTER, kernel $VNIC_KERNEL"

knob() { [[ $KNOBS == *" $1 "* ]]; }

# The guest: IPv6 on (its groups churn too), the kernel knobs, then vnic-churn.
churn_guest() {
    local n=$1
    cat <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.44.0.$((n + 10))/24 dev eth0
echo 0 > /proc/sys/net/ipv6/conf/all/disable_ipv6
echo 0 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6
$(knob maxmem && echo "echo 8 > /proc/sys/net/ipv4/igmp_max_memberships")
$(knob optmem && echo "echo 20480 > /proc/sys/net/core/optmem_max")
# IPv6 joins its link-local groups from deferred work: wait until the list stops changing.
i=0
until ip -6 addr show dev eth0 | grep -q fe80; do i=\$((i + 1)); [ \$i -gt 100 ] && break; sleep 0.1; done
prev=""; cur=\$(mcast_snapshot eth0); i=0
until [ "\$cur" = "\$prev" ] || [ \$i -gt 10 ]; do prev=\$cur; sleep 1; cur=\$(mcast_snapshot eth0); i=\$((i + 1)); done
vnic-churn eth0 $SEED $THREADS $OPS $CHECKPOINTS 7200 $POOL $(knob versions && echo versions) || exit 1
report_stats eth0
GUEST
}

ns=vnic-churn-$$
make_netns "$ns"
ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=0 net.ipv6.conf.default.disable_ipv6=0
args=(--tap vtap0 --filter "$FILTER")
socks=()
for i in "${!GUESTS[@]}"; do
    socks+=(--socket "$RUN_DIR/p$i.sock")
    case ${GUESTS[$i]} in
        qmp) args+=(--qmp "$RUN_DIR/qmp$i.sock,port=$i,nic=nic0") ;;
        snoop | device) ;;
        *) die "unknown guest kind ${GUESTS[$i]}" ;;
    esac
done
[[ " ${GUESTS[*]} " == *" snoop "* ]] && args+=(--snoop)
knob querier && args+=(--snoop-timeout 6)
# Each audit's query and judgement in the daemon's log (kept when the run fails).
RUST_LOG=${RUST_LOG:-info,dpaa_vnic::ports::vhost_user::guest_port=debug} start_daemon d "$ns" "${socks[@]}" "${args[@]}"
dpid=${DAEMON_PID[d]}
ip netns exec "$ns" ip addr add 10.44.0.1/24 dev vtap0
ip netns exec "$ns" ip link set vtap0 up

checks=()
for i in "${!GUESTS[@]}"; do
    churn_guest "$i" | make_initrd "g$i"
    case ${GUESTS[$i]} in
        device) start_guest "g$i" device "p$i.sock" "g$i" ;;
        snoop) start_guest "g$i" net "p$i.sock" "g$i" 1 "52:54:00:d0:aa:$(printf %02x $((i + 1)))" ;;
        qmp) GUEST_EXTRA_ARGS="-qmp unix:$RUN_IN_CHROOT/qmp$i.sock,server=on,wait=off" \
            start_guest "g$i" net "p$i.sock" "g$i" 1 "52:54:00:d0:aa:$(printf %02x $((i + 1)))" ;;
    esac
    # The MAC each guest sends from: the daemon's default for a device attachment, the one
    # given to QEMU for a net attachment; the same here.
    checks+=(--guest "$i:${GUESTS[$i]}:$RUN_DIR/g$i.log")
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$dpid/stat"; }
sum_counter() {
    local key=$1 total=0 i
    for i in "${!GUESTS[@]}"; do total=$((total + $(daemon_counter d "$i" "$key"))); done
    echo "$total"
}

for i in "${!GUESTS[@]}"; do wait_console "g$i" "VNIC-CHURN seed" "$GUEST_TIMEOUT" || exit 1; done
read -r converge_median converge_worst <<<"${VNIC_CHURN_CONVERGE:-2 3}"
t0=$(date +%s.%N)
ticks0=$(cpu_ticks)
syncs0=$(sum_counter filter_syncs)
cmds0=$(sum_counter ctrl_commands)
divergences=0
passed=0
state=$RUN_DIR/churn-state.json
# The checker starts as the guests go on, and polls the tables while they churn: it needs
# them from the moment of each guest's last change.
for ((k = 1; k <= CHECKPOINTS + 2; k++)); do
    if ip netns exec "$ns" python3 "$REPO_ROOT/scripts/churn-check" --ctl "$RUN_DIR/d.ctl" \
        --tap vtap0 --layout "$FILTER" --checkpoint "$k" --state "$state" --pool "$POOL" "${checks[@]}" \
        >"$RUN_DIR/check-$k.log" 2>&1; then
        passed=$((passed + 1))
        tail -1 "$RUN_DIR/check-$k.log" >&2
    else
        divergences=$((divergences + $(grep -c '^DIVERGED' "$RUN_DIR/check-$k.log" || true)))
        cat "$RUN_DIR/check-$k.log" >&2
    fi
    grep -h '^CONVERGED' "$RUN_DIR/check-$k.log" | tee -a "$RUN_DIR/converged.txt" >&2 || true
    grep -h '^SLOW' "$RUN_DIR/check-$k.log" >&2 || true
    for i in "${!GUESTS[@]}"; do
        ip netns exec "$ns" "$HOST_UDP" send "10.44.0.$((i + 10))" 7200 1 16 >/dev/null
    done
done
elapsed=$(elapsed_since "$t0")
ticks=$(($(cpu_ticks) - ticks0))
syncs=$(($(sum_counter filter_syncs) - syncs0))
cmds=$(($(sum_counter ctrl_commands) - cmds0))
for i in "${!GUESTS[@]}"; do wait_guest "g$i" || exit 1; done
ops=0
enobufs=0
churn_ms=0
for i in "${!GUESTS[@]}"; do
    ops=$((ops + $(tr -d '\r' <"$RUN_DIR/g$i.log" | sed -n 's/^VNIC-CHURN-DONE ops=//p')))
    last=$(tr -d '\r' <"$RUN_DIR/g$i.log" | grep -a '^VNIC-CHECKPOINT' | tail -1)
    enobufs=$((enobufs + $(sed 's/.*enobufs=\([0-9]*\).*/\1/' <<<"$last")))
    # The guests churn at the same time: the slowest one's churn time is the run's.
    churn_ms=$(awk -v a="$churn_ms" -v b="$(sed 's/.*churn_ms=//' <<<"$last")" 'BEGIN { print (b > a) ? b : a }')
done
# The longest the daemon kept a guest waiting for a control command's answer, 99th
# percentile and worst, over the device-attachment ports.
read -r p99 pmax < <(ctl d stats | python3 -c '
import json, sys
p = [x["ctrl_answer"] for x in json.load(sys.stdin)["ports"] if x.get("ctrl_commands")]
print(max([x["p99_ns"] for x in p] or [0]) // 1000, max([x["max_ns"] for x in p] or [0]) // 1000)')
hz=$(getconf CLK_TCK)
# Rates over the time the guests spent churning (checkpoints left out): the syncs and
# commands an operation caused may follow it into the checkpoint (a 7.x driver sends from
# deferred work, a snooped guest's reports are postponed), so they are counted per
# operation and scaled by the churn rate. The daemon's CPU share is over the whole run.
report=$(awk -v ops="$ops" -v s="$elapsed" -v c="$churn_ms" -v syncs="$syncs" -v cmds="$cmds" -v t="$ticks" \
    -v hz="$hz" -v p99="$p99" -v pmax="$pmax" -v nb="$enobufs" \
    'BEGIN { c = (c > 0) ? c / 1000 : s; r = ops / c;
             printf "%d ops in %.2f s of churn (%.0f ops/s; %d ENOBUFS); per op %.2f syncs and %.2f control commands (%.0f syncs/s, %.0f commands/s while churning); answers within %d us at p99, %d us at worst; daemon CPU %.1f %% over %.0f s", ops, c, r, nb, syncs / ops, cmds / ops, r * syncs / ops, r * cmds / ops, p99, pmax, 100 * t / hz / s, s }')
# How long each port's table took to be exact after its guest's last change, over every
# checkpoint: median, 95th percentile, worst.
read -r c_n c_med c_p95 c_max < <(awk '{print $6}' "$RUN_DIR/converged.txt" 2>/dev/null | sort -n | awk '
    { v[NR] = $1 } END { if (NR == 0) { print 0, 0, 0, 0; exit }
      p = int(0.95 * NR + 0.999); if (p < 1) p = 1
      printf "%d %.2f %.2f %.2f\n", NR, (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[p], v[NR] }')
printf 'REPORT churn %s, %s, filter %s, seed %s, knobs:%s; %s; tables exact after median %s s, p95 %s s, worst %s s (%d port-checkpoints); checkpoints passed %d of %d, divergences %d\n' \
    "${GUESTS[*]}" "$(cat "$GUEST_DIR/kernel-package")" "$FILTER" "$SEED" "${KNOBS% }" "$report" \
    "$c_med" "$c_p95" "$c_max" "$c_n" "$passed" "$((CHECKPOINTS + 2))" "$divergences" | tee -a "$RUN_DIR/../reports.txt"
# The snooper's own account of the run: reports, records by kind, audits.
grep -h '^SNOOP' "$RUN_DIR/check-$((CHECKPOINTS + 2)).log" >&2 || true
# Every port-checkpoint's time, for scripts/stress's distributions.
echo "CONVERGE-TIMES $(awk '{printf "%s ", $6}' "$RUN_DIR/converged.txt" 2>/dev/null)"
expect_eq "churn divergences (seed $SEED)" "$divergences" 0
expect_le "median seconds from a guest's last change to an exact table" "$c_med" "$converge_median"
expect_le "worst seconds from a guest's last change to an exact table" "$c_max" "$converge_worst"
if knob maxmem; then
    # igmp_max_memberships 8: joins past it fail in the guest, and the filter stayed exact.
    expect_ge "joins refused with ENOBUFS past igmp_max_memberships" "$enobufs" 1
fi
expect_eq "control commands refused" "$(sum_counter ctrl_errors)" 0

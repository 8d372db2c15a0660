#!/usr/bin/env bash
# Two guests on different subnets, one per port (net and device attachment), talk through
# dpaa-vnic's router, over IPv4 and IPv6: each resolves its gateway (ARP, neighbour
# discovery), they ping each other with no loss, traceroute shows the router as hop 1 (ICMP
# time exceeded from it) and the peer as hop 2, and 300 counted UDP datagrams go each way.
# The daemon's per-queue route counters show the cache at work: after the first packet to
# a destination, hits, not misses.
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

N=300
# guest_script SELF_NET PEER_NET
guest_script() {
    cat <<GUEST
# routed PING TRACEROUTE GATEWAY PEER: PEER answers (retried), then 5 pings with no loss,
# and TRACEROUTE shows GATEWAY as hop 1 and PEER as hop 2.
routed() {
    retry 90 \$1 -c 1 -W 1 \$4 || return 1
    \$1 -c 5 -W 2 \$4 >/tmp/ping.txt; cat /tmp/ping.txt
    grep -q " 0% packet loss" /tmp/ping.txt || return 1
    \$2 -n -q 1 -w 3 -m 3 \$4 >/tmp/tr.txt 2>&1; cat /tmp/tr.txt
    awk -v gw=\$3 -v peer=\$4 '\$1 == 1 && \$2 == gw {a = 1} \$1 == 2 && \$2 == peer {b = 1} END {exit !(a && b)}' /tmp/tr.txt
}
peer_listen $N
wait_carrier eth0 || exit 1
ip addr add 10.$1.0.2/24 dev eth0
ip route add default via 10.$1.0.1
retry 30 ping -c 1 -W 1 10.$1.0.1 || exit 1
echo "gateway 10.$1.0.1 answers"
routed ping traceroute 10.$1.0.1 10.$2.0.2 || exit 1
# IPv6: neighbour discovery instead of ARP, hop limit instead of TTL.
# No duplicate address detection: the addresses are usable at once (busybox ip has no nodad).
echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad
echo 0 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6
ip -6 addr add fd00:$1::2/64 dev eth0
ip -6 route add default via fd00:$1::1
routed ping6 traceroute6 fd00:$1::1 fd00:$2::2 || exit 1
peer_exchange 10.$2.0.2 $N || exit 1
report_stats eth0
GUEST
}
guest_script 1 2 | make_initrd a
guest_script 2 1 | make_initrd b

start_daemon r - --socket "$RUN_DIR/a.sock" --socket "$RUN_DIR/b.sock" \
    --router-ip 0=10.1.0.1/24 --router-ip 1=10.2.0.1/24 \
    --router-ip 0=fd00:1::1/64 --router-ip 1=fd00:2::1/64
start_guest ga net a.sock a 1 52:54:00:d0:aa:01
start_guest gb device b.sock b
wait_guest ga
wait_guest gb
compare_counters ga r 0
compare_counters gb r 1
ctl r route list >"$RUN_DIR/routes.json"
expect_eq "neighbours learned by ARP and neighbour discovery" "$(python3 -c '
import json, sys
print(" ".join(sorted(n["ip"] for n in json.load(open(sys.argv[1]))["neighbours"])))' "$RUN_DIR/routes.json")" \
    "10.1.0.2 10.2.0.2 fd00:1::2 fd00:2::2"
for p in 0 1; do
    expect_ge "port $p: routed" "$(daemon_counter r $p routed)" "$N"
    expect_ge "port $p: route cache hits" "$(daemon_counter r $p route_cache_hit)" "$N"
    expect_eq "port $p: no route" "$(daemon_counter r $p route_unreachable)" 0
    expect_eq "port $p: bad headers" "$(daemon_counter r $p route_errors)" 0
done
# Time exceeded for traceroute's first probes, from the router.
expect_ge "TTL exceeded answered" "$(($(daemon_counter r 0 route_ttl_exceeded) + $(daemon_counter r 1 route_ttl_exceeded)))" 2
miss0=$(daemon_counter r 0 route_cache_miss)
hit0=$(daemon_counter r 0 route_cache_hit)
printf 'REPORT router port 0: %s routed, route cache %s hits / %s misses\n' \
    "$(daemon_counter r 0 routed)" "$hit0" "$miss0" | tee -a "$RUN_DIR/../reports.txt"

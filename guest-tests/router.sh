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
vnic-udp recv 5003 $N 120 >/tmp/recv.txt & rp=\$!
vnic-udp recv 5004 1 180 >/tmp/done.txt & dp=\$!
wait_carrier eth0 || exit 1
ip addr add 10.$1.0.2/24 dev eth0
ip route add default via 10.$1.0.1
i=0
until ping -c 1 -W 1 10.$1.0.1 >/dev/null 2>&1; do i=\$((i + 1)); [ \$i -gt 30 ] && exit 1; done
echo "gateway 10.$1.0.1 answers"
i=0
until ping -c 1 -W 1 10.$2.0.2 >/dev/null 2>&1; do i=\$((i + 1)); [ \$i -gt 90 ] && exit 1; done
ping -c 5 -W 2 10.$2.0.2 >/tmp/ping.txt; cat /tmp/ping.txt
grep -q " 0% packet loss" /tmp/ping.txt || exit 1
traceroute -n -q 1 -w 3 -m 3 10.$2.0.2 >/tmp/tr.txt 2>&1; cat /tmp/tr.txt
awk '\$1 == 1 && \$2 == "10.$1.0.1" {a = 1} \$1 == 2 && \$2 == "10.$2.0.2" {b = 1} END {exit !(a && b)}' /tmp/tr.txt || exit 1
# IPv6: neighbour discovery instead of ARP, hop limit instead of TTL.
# No duplicate address detection: the addresses are usable at once (busybox ip has no nodad).
echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad
echo 0 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6
ip -6 addr add fd00:$1::2/64 dev eth0
ip -6 route add default via fd00:$1::1
i=0
until ping6 -c 1 -W 1 fd00:$2::2 >/dev/null 2>&1; do i=\$((i + 1)); [ \$i -gt 90 ] && exit 1; done
ping6 -c 5 -W 2 fd00:$2::2 >/tmp/ping6.txt; cat /tmp/ping6.txt
grep -q " 0% packet loss" /tmp/ping6.txt || exit 1
traceroute6 -n -q 1 -w 3 -m 3 fd00:$2::2 >/tmp/tr6.txt 2>&1; cat /tmp/tr6.txt
awk '\$1 == 1 && \$2 == "fd00:$1::1" {a = 1} \$1 == 2 && \$2 == "fd00:$2::2" {b = 1} END {exit !(a && b)}' /tmp/tr6.txt || exit 1
vnic-udp send 10.$2.0.2 5003 $N 200 1000 || exit 1
wait \$rp; r=\$?; cat /tmp/recv.txt; [ \$r = 0 ] || exit 1
vnic-udp send 10.$2.0.2 5004 1 64 || exit 1
wait \$dp || exit 1
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

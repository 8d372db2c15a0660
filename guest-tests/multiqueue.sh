#!/usr/bin/env bash
# Two queue pairs, one worker thread each: a 2-vCPU guest sends from each CPU (XPS puts
# CPU n on TX queue n) and the host sends 16 UDP flows (fixed source ports) through the tap.
# dpaa-vnic steers each flow to an RX queue by its Toeplitz hash: with the driver's own RSS
# key and indirection table in the device attachment (RSS_CONFIG through the control
# queue, shown by `ctl filter`), with the default key over both queues in the net
# attachment. An independent Python Toeplitz predicts each flow's queue; the daemon's
# per-queue counters must match the prediction, and the totals match the guest.
# vnic-kernels: bookworm trixie-bpo
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run

N=200
FLOWS=16
# Microsoft's verification key: dpaa-vnic's default until a driver sets its own, and the
# one the guest sets with its table. With it the 16 flows spread 175/225 over the table.
MS_KEY=6d5a56da255b0ec24167253d43a38fb0d0ca2bcbae7b30b477cb2da38030f20c6a42b73bbeac01fa
make_initrd guest <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.99.0.2/24 dev eth0
# Steer through RSS where the device offers it (device attachment): entry i -> (i+1) % 2,
# the opposite of automatic spreading, so the prediction tells the two apart. The key is
# set too: Linux draws its own at random each boot, and with some of those keys every one
# of the flows lands on one queue.
vnic-rss eth0 2 1 $MS_KEY; echo "VNIC-RSS rc=\$?"
echo "VNIC: \$(ls -d /sys/class/net/eth0/queues/tx-* | wc -l) tx queues"
ping -c 2 -W 2 10.99.0.1 >/dev/null || exit 1
taskset 1 vnic-udp send 10.99.0.1 6001 $N 100 1000 || exit 1
taskset 2 vnic-udp send 10.99.0.1 6001 $N 100 1000 || exit 1
vnic-udp recv 6002 $((N * FLOWS / 8)) 90 || exit 1
report_stats eth0
GUEST

for mode in net device; do
    ns=vnic-mq-$mode-$$
    make_netns "$ns"
    start_daemon d-$mode "$ns" --queues 2 --socket "$RUN_DIR/$mode.sock" --tap vtap0
    ip netns exec "$ns" ip addr add 10.99.0.1/24 dev vtap0
    ip netns exec "$ns" ip link set vtap0 up
    ip netns exec "$ns" "$HOST_UDP" recv 6001 $((2 * N)) 120 >"$RUN_DIR/host-recv-$mode.log" 2>&1 &
    PIDS+=($!)
    hostrecv=$!
    start_guest g-$mode $mode $mode.sock guest 2
    wait_console g-$mode "listening 6002" "$GUEST_TIMEOUT" || exit 1
    if [[ $mode == device ]]; then
        # The driver enables both pairs through the control queue's VQ_PAIRS_SET.
        pairs=$(ctl d-$mode filter | python3 -c 'import json,sys; print(json.load(sys.stdin)["ports"][0]["active_queue_pairs"])')
        expect_eq "device: active queue pairs set by the driver" "$pairs" 2
    fi
    # The steering in force while the guest runs (a disconnect resets it).
    ctl d-$mode filter >"$RUN_DIR/filter-$mode.json"
    rss_rc=$(grep -a -o "VNIC-RSS rc=[0-9]*" "$RUN_DIR/g-$mode.log" | tr -d '\r')
    table=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["ports"][0]["rss"]; print(r and r["indirection"][:4])' "$RUN_DIR/filter-$mode.json")
    if [[ $mode == device ]]; then
        expect_eq "device: the driver set RSS (ethtool -X)" "$rss_rc" "VNIC-RSS rc=0"
        expect_eq "device: indirection table in the daemon" "$table" "[1, 0, 1, 0]"
        expect_eq "device: the key the driver set, in the daemon" \
            "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ports"][0]["rss"]["key"])' "$RUN_DIR/filter-$mode.json")" "$MS_KEY"
        expect_eq "device: control errors" "$(daemon_counter d-$mode 0 ctrl_errors)" 0
    else
        expect_eq "net: no RSS without rss=on in QEMU" "$rss_rc" "VNIC-RSS rc=3"
    fi
    # Each sender uses its own source port, so each is its own flow for the tap's hash.
    for f in $(seq $FLOWS); do
        ip netns exec "$ns" "$HOST_UDP" send 10.99.0.2 6002 $((N / 8)) 100 200 $((40000 + f)) >/dev/null &
        PIDS+=($!)
    done
    wait_guest g-$mode
    wait "$hostrecv" || { log "host: $(cat "$RUN_DIR/host-recv-$mode.log")"; exit 1; }
    for q in 0 1; do
        expect_ge "$mode: tx_packets on queue $q" "$(daemon_counter d-$mode 0 tx_packets $q)" 1
        expect_ge "$mode: rx_packets on queue $q" "$(daemon_counter d-$mode 0 rx_packets $q)" 1
    done
    if [[ $mode == device ]]; then
        expect_eq "device: hash report negotiated" \
            "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ports"][0]["hash_report"])' "$RUN_DIR/filter-$mode.json")" True
    fi
    rx0=$(daemon_counter d-$mode 0 rx_packets 0)
    rx1=$(daemon_counter d-$mode 0 rx_packets 1)
    verdict=$(python3 - "$RUN_DIR/filter-$mode.json" $FLOWS $((N / 8)) "$rx0" "$rx1" "$MS_KEY" <<'ORACLE'
import ipaddress, json, sys
port = json.load(open(sys.argv[1]))["ports"][0]
flows, per_flow, rx = int(sys.argv[2]), int(sys.argv[3]), [int(sys.argv[4]), int(sys.argv[5])]
key = bytes.fromhex(sys.argv[6])
table = None
if port["rss"] and port["rss"]["indirection"]:
    key, table = bytes.fromhex(port["rss"]["key"]), port["rss"]["indirection"]
def toeplitz(data):
    kbits = int.from_bytes(key, "big")
    klen = len(key) * 8
    h = 0
    for i in range(len(data) * 8):
        if data[i // 8] & (0x80 >> (i % 8)):
            h ^= (kbits >> (klen - 32 - i)) & 0xFFFFFFFF if klen - 32 - i >= 0 else (kbits << (i + 32 - klen)) & 0xFFFFFFFF
    return h
expect = [0, 0]
for f in range(1, flows + 1):
    data = ipaddress.ip_address("10.99.0.1").packed + ipaddress.ip_address("10.99.0.2").packed
    data += (40000 + f).to_bytes(2, "big") + (6002).to_bytes(2, "big")
    h = toeplitz(data)
    q = table[h & (len(table) - 1)] if table else h % 2
    expect[q] += per_flow
other = sum(rx) - sum(expect)
ok = other >= 0 and all(0 <= rx[q] - expect[q] <= other for q in (0, 1))
print(("ok" if ok else "MISMATCH"), "mode=" + ("rss" if table else "automatic"),
      f"predicted={expect[0]}/{expect[1]} daemon={rx[0]}/{rx[1]} other={other}")
ORACLE
)
    log "$mode: steering $verdict"
    [[ $verdict == ok* ]] || { log "FAIL: $mode: per-queue RX does not follow the Toeplitz prediction"; exit 1; }
    printf 'REPORT multiqueue %-6s %s\n' "$mode" "$verdict" | tee -a "$RUN_DIR/../reports.txt"
    compare_counters g-$mode d-$mode 0
    stop_daemon d-$mode
done

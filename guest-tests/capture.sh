#!/usr/bin/env bash
# ctl capture: a guest (device attachment, so its driver programs the DPAA filter, mEMAC
# layout by default) joins 239.1.1.1 only. While `ctl capture 0 FILE --seconds S` runs, the
# host sends N datagrams to each of three groups, and the guest sends M datagrams of 100
# bytes to the host:
#   239.1.1.3: its MAC's bucket (the parity of each octet, docs/filter.md) holds none of the
#              guest's groups: the filter refuses them;
#   239.1.1.2: same bucket as 239.1.1.1 (the last octets 01 and 02 have the same parity): the
#              filter takes them, a hash false positive, and the guest's stack drops them;
#   239.1.1.1: joined.
# Debian's tcpdump reads the file and finds every one of those frames, each once; an
# independent pcapng walk (Python, below) finds each group's frames with the fate the
# filter gave them; the guest's sockets got exactly the N it joined for; ctl capture's
# summary and the daemon's counters agree with the file.
# vnic-kernels: bookworm
set -euo pipefail
source "$(dirname "$0")/../scripts/guest-lib.sh"
setup_run
command -v tcpdump >/dev/null || die "tcpdump is missing: scripts/provision --for-tests installs it"

N=20
M=30
SECONDS_CAPTURED=20
make_initrd guest <<GUEST
wait_carrier eth0 || exit 1
ip addr add 10.77.0.2/24 dev eth0
vnic-udp recv 6100 $N 120 >/tmp/rx 2>&1 & r=\$!
vnic-mcast ip eth0 239.1.1.1 1 6102 240 >/tmp/m 2>&1 & m=\$!
wait_line /tmp/m VNIC-JOINED || exit 1
echo "VNIC-READY"
wait \$r || { cat /tmp/rx; exit 1; }
grep received /tmp/rx | sed 's/^/VNIC-RX /'
vnic-udp send 10.77.0.1 6201 $M 100 || exit 1
echo "VNIC-SENT"
vnic-udp send 127.0.0.1 6102 1 16 >/dev/null
wait \$m || exit 1
report_stats eth0
GUEST

ns=vnic-capture-$$
make_netns "$ns"
inns() { ip netns exec "$ns" "$@"; }
start_daemon d "$ns" --socket "$RUN_DIR/device.sock" --tap vtap0
inns ip addr add 10.77.0.1/24 dev vtap0
inns ip link set vtap0 up
inns ip route add 224.0.0.0/4 dev vtap0
start_guest g device device.sock guest
wait_console g "VNIC-READY" "$GUEST_TIMEOUT" || exit 1
joined() { ctl d filter | grep -q '01:00:5e:01:01:01'; }
wait_for 10 "239.1.1.1 in the port's filter" joined || exit 1

pcap=$RUN_DIR/port0.pcapng
filtered_before=$(daemon_counter d 0 rx_filtered)
false_before=$(daemon_counter d 0 rx_hash_false_positive)
"$VNIC_BIN" ctl --control "$RUN_DIR/d.ctl" capture 0 "$pcap" --seconds "$SECONDS_CAPTURED" \
    2>"$RUN_DIR/capture.summary" &
capture=$!
PIDS+=("$capture")
# The client writes the section and interface blocks once the daemon has armed the capture.
wait_for 10 "the capture armed" test -s "$pcap" || exit 1
# Paced as tap.sh explains; the joined group last.
for g in 239.1.1.3 239.1.1.2 239.1.1.1; do
    inns "$HOST_UDP" send $g 6100 "$N" 80 200 >/dev/null
done
wait_console g "VNIC-SENT" 120 || exit 1
wait_for $((SECONDS_CAPTURED + 15)) "ctl capture to end" bash -c "! kill -0 $capture" || exit 1
wait "$capture" || die "ctl capture failed: $(cat "$RUN_DIR/capture.summary")"
filtered=$(($(daemon_counter d 0 rx_filtered) - filtered_before))
false_positives=$(($(daemon_counter d 0 rx_hash_false_positive) - false_before))
summary=$(cat "$RUN_DIR/capture.summary")
log "ctl capture: $summary"
wait_guest g
expect_eq "the guest's sockets received the joined group's datagrams" \
    "$(grep -a 'VNIC-RX' "$RUN_DIR/g.log" | tr -d '\r' | awk '{print $3}')" "$N"

# What tcpdump finds in the file.
seen() { tcpdump -nn -r "$pcap" "$1" 2>/dev/null | wc -l; }
expect_eq "tcpdump: datagrams to the joined group" "$(seen 'udp and dst host 239.1.1.1 and dst port 6100')" "$N"
expect_eq "tcpdump: datagrams to the other group of its bucket" "$(seen 'udp and dst host 239.1.1.2 and dst port 6100')" "$N"
expect_eq "tcpdump: datagrams to a group of no bucket of the guest's" "$(seen 'udp and dst host 239.1.1.3 and dst port 6100')" "$N"
expect_eq "tcpdump: datagrams the guest sent" "$(seen 'udp and src host 10.77.0.2 and dst host 10.77.0.1 and dst port 6201')" "$M"
expect_eq "tcpdump: each of them whole (100 bytes of payload)" \
    "$(tcpdump -nn -r "$pcap" 'udp and dst port 6201' 2>/dev/null | grep -c 'length 100$')" "$M"

# An independent walk of the pcapng blocks: per interface and comment, the frames to each
# group and from the guest.
walk=$(python3 - "$pcap" <<'PY'
import collections, socket, struct, sys
data = open(sys.argv[1], "rb").read()
assert data[:4] == b"\x0a\x0d\x0d\x0a" and data[8:12] == b"\x4d\x3c\x2b\x1a", "not little-endian pcapng"
names, counts, at = [], collections.Counter(), 0
while at < len(data):
    kind, length = struct.unpack_from("<II", data, at)
    body = data[at + 8:at + length - 4]
    if kind == 1:  # interface description: the name is option 2
        o, name = 8, "?"
        while o + 4 <= len(body):
            code, olen = struct.unpack_from("<HH", body, o)
            if code == 2:
                name = body[o + 4:o + 4 + olen].decode()
            o += 4 + (olen + 3) // 4 * 4
        names.append(name)
    elif kind == 6:  # enhanced packet
        ifid, _, _, caplen, _ = struct.unpack_from("<IIIII", body)
        frame = body[20:20 + caplen]
        o, comment = 20 + (caplen + 3) // 4 * 4, "-"
        while o + 4 <= len(body):
            code, olen = struct.unpack_from("<HH", body, o)
            if code == 1:
                comment = body[o + 4:o + 4 + olen].decode()
            o += 4 + (olen + 3) // 4 * 4
        what = "other"
        if frame[12:14] == b"\x08\x00" and frame[23] == 17:
            what = f"udp {socket.inet_ntoa(frame[26:30])}>{socket.inet_ntoa(frame[30:34])}"
        counts[(names[ifid], what, comment)] += 1
    at += length
for (ifname, what, comment), n in sorted(counts.items()):
    print(f"{ifname}|{what}|{comment}|{n}")
PY
)
log "the file, by interface, frame and comment:"$'\n'"$walk"
count_of() { awk -F'|' -v k="$1|$2|$3" '$1"|"$2"|"$3 == k {print $4}' <<<"$walk" | grep . || echo 0; }
expect_eq "walk: the frames for no bucket of the guest's, refused by the filter" \
    "$(count_of port0-rx 'udp 10.77.0.1>239.1.1.3' 'dropped: receive filter (address)')" "$N"
expect_eq "walk: the frames for the joined group's bucket, taken by chance" \
    "$(count_of port0-rx 'udp 10.77.0.1>239.1.1.2' 'accepted: hash bucket false positive')" "$N"
expect_eq "walk: the joined group's frames offered and taken, with no comment" \
    "$(count_of port0-rx 'udp 10.77.0.1>239.1.1.1' -)" "$N"
expect_eq "walk: the guest's datagrams on the port's tx interface" \
    "$(count_of port0-tx 'udp 10.77.0.2>10.77.0.1' -)" "$M"
expect_eq "walk: no frame of the joined group marked dropped" \
    "$(grep -c '239.1.1.1|dropped' <<<"$walk" || true)" 0

# The summary counts what the file holds; the daemon's counter saw at least the refusals
# the capture recorded (it counts from before the capture was armed).
dropped=$(grep -o '[0-9]* receive filter (address)' <<<"$summary" | awk '{print $1}')
expect_ge "summary: refusals by the address filter" "${dropped:-0}" "$N"
expect_le "summary: refusals recorded, at most the daemon's rx_filtered" "${dropped:-0}" "$filtered"
expect_ge "the daemon's hash false positives meanwhile" "$false_positives" "$N"
expect_eq "summary: nothing lost to a full ring" "$(grep -c 'ring was full' <<<"$summary" || true)" 0
frames=$(sed -n 's/^port 0: captured \([0-9]*\) frames.*/\1/p' <<<"$summary")
expect_eq "summary: frames, as the file holds them" "$frames" "$(tcpdump -nn -r "$pcap" 2>/dev/null | wc -l)"
# Disarmed at the end: a second capture of the port is taken, this one live into tcpdump
# through a pipe. The guest is gone, and the switch still offers the port what comes: one
# datagram every 0.2 s until the capture has its count.
(set -o pipefail
 "$VNIC_BIN" ctl --control "$RUN_DIR/d.ctl" capture 0 - --direction rx --count 3 --seconds 30 \
     2>"$RUN_DIR/capture2.summary" | tcpdump -nn -r - 2>/dev/null >"$RUN_DIR/capture2.txt") &
live=$!
PIDS+=("$live")
for _ in $(seq 100); do
    kill -0 "$live" 2>/dev/null || break
    inns "$HOST_UDP" send 239.1.1.1 6100 1 80 >/dev/null
    sleep 0.2
done
wait "$live" || die "a second capture after the first ended failed: $(cat "$RUN_DIR/capture2.summary")"
expect_eq "live: tcpdump read the frames through the pipe" \
    "$(grep -c '239.1.1.1.6100: UDP, length 80' "$RUN_DIR/capture2.txt")" 3
printf 'REPORT capture: %s frames in %s s on port 0 (tcpdump reads them all); %s refused by the filter and %s hash false positives, each marked; %s sent by the guest\n' \
    "$frames" "$SECONDS_CAPTURED" "$dropped" "$N" "$M" | tee -a "$RUN_DIR/../reports.txt"
stop_daemon d

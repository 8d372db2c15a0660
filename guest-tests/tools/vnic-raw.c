/*
 * vnic-raw: sends hand-built IPv4/UDP frames with deliberately wrong checksums through an
 * AF_PACKET socket, so the guest stack cannot fix them on the way out.
 *   vnic-raw IFNAME DST_MAC SRC_IP DST_IP PORT COUNT MODE [SRC_MAC]
 * MODE:
 *   broken  even frames: bad IP header and UDP checksums; odd frames: good IP header, bad
 *           UDP checksum. Payload lengths vary (odd and even); the IP header carries a
 *           4-byte option (IHL 6).
 *   lying   IP total length 100 bytes beyond the frame: no checksum action may trust it.
 * SRC_MAC: the Ethernet source to send from instead of the interface's own (spoof.sh).
 * Each datagram's payload starts with its 8-byte sequence number. Prints "sent N".
 */
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

static int parse_mac(const char *s, uint8_t m[6]) {
    unsigned v[6];
    if (sscanf(s, "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6) return -1;
    for (int i = 0; i < 6; i++) m[i] = (uint8_t)v[i];
    return 0;
}

static uint16_t csum(const uint8_t *p, size_t n) {
    uint32_t acc = 0;
    for (size_t i = 0; i + 1 < n; i += 2) acc += (uint32_t)(p[i] << 8 | p[i + 1]);
    if (n & 1) acc += (uint32_t)p[n - 1] << 8;
    while (acc >> 16) acc = (acc & 0xffff) + (acc >> 16);
    return (uint16_t)~acc;
}

int main(int argc, char **argv) {
    if (argc != 8 && argc != 9) {
        fprintf(stderr, "usage: vnic-raw IFNAME DST_MAC SRC_IP DST_IP PORT COUNT broken|lying [SRC_MAC]\n");
        return 2;
    }
    uint8_t dmac[6];
    struct in_addr src, dst;
    int lying = strcmp(argv[7], "lying") == 0;
    if (parse_mac(argv[2], dmac) || inet_pton(AF_INET, argv[3], &src) != 1 ||
        inet_pton(AF_INET, argv[4], &dst) != 1 || (!lying && strcmp(argv[7], "broken"))) {
        fprintf(stderr, "vnic-raw: bad argument\n");
        return 2;
    }
    int port = atoi(argv[5]);
    long count = atol(argv[6]);
    int s = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_IP));
    if (s < 0) { perror("socket"); return 1; }
    struct ifreq ifr = {0};
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", argv[1]);
    if (ioctl(s, SIOCGIFINDEX, &ifr) < 0) { perror("SIOCGIFINDEX"); return 1; }
    int ifindex = ifr.ifr_ifindex;
    if (ioctl(s, SIOCGIFHWADDR, &ifr) < 0) { perror("SIOCGIFHWADDR"); return 1; }
    uint8_t smac[6];
    memcpy(smac, ifr.ifr_hwaddr.sa_data, 6);
    if (argc == 9 && parse_mac(argv[8], smac)) { fprintf(stderr, "vnic-raw: bad SRC_MAC\n"); return 2; }
    struct sockaddr_ll to = { .sll_family = AF_PACKET, .sll_ifindex = ifindex, .sll_halen = 6 };
    memcpy(to.sll_addr, dmac, 6);

    uint8_t f[1600];
    long sent = 0;
    for (long i = 0; i < count; i++) {
        size_t payload = 20 + (size_t)(i % 37); /* odd and even lengths */
        size_t ihl = 24, udp_len = 8 + payload, ip_len = ihl + udp_len, n = 14 + ip_len;
        memset(f, 0, sizeof(f));
        memcpy(f, dmac, 6);
        memcpy(f + 6, smac, 6);
        f[12] = 0x08; f[13] = 0x00;
        uint8_t *ip = f + 14;
        ip[0] = 0x46;
        uint16_t tot = (uint16_t)(lying ? ip_len + 100 : ip_len);
        ip[2] = tot >> 8; ip[3] = tot & 0xff;
        ip[4] = (uint8_t)(i >> 8); ip[5] = (uint8_t)i;
        ip[6] = 0x40; /* DF */
        ip[8] = 64; ip[9] = 17;
        memcpy(ip + 12, &src, 4);
        memcpy(ip + 16, &dst, 4);
        ip[20] = 1; ip[21] = 1; ip[22] = 1; ip[23] = 0; /* NOP NOP NOP EOL */
        uint16_t ipc = csum(ip, ihl);
        if (i % 2 == 0 || lying) ipc ^= 0x5a5a;
        ip[10] = ipc >> 8; ip[11] = ipc & 0xff;
        uint8_t *udp = ip + ihl;
        udp[0] = 0x9c; udp[1] = 0x40; /* source port 40000 */
        udp[2] = (uint8_t)(port >> 8); udp[3] = (uint8_t)port;
        udp[4] = (uint8_t)(udp_len >> 8); udp[5] = (uint8_t)udp_len;
        memcpy(udp + 8, &i, sizeof(i));
        for (size_t k = sizeof(i); k < payload; k++) udp[8 + k] = (uint8_t)(k * 7);
        /* The right checksum over pseudo-header and datagram, then spoiled: never valid,
         * never zero (zero would mean "no checksum" and pass unchecked). */
        uint8_t ph[12 + 1600];
        memcpy(ph, &src, 4); memcpy(ph + 4, &dst, 4);
        ph[8] = 0; ph[9] = 17; ph[10] = (uint8_t)(udp_len >> 8); ph[11] = (uint8_t)udp_len;
        memcpy(ph + 12, udp, udp_len);
        uint16_t uc = csum(ph, 12 + udp_len) ^ 0x5a5a;
        if (uc == 0) uc = 1;
        udp[6] = uc >> 8; udp[7] = uc & 0xff;
        if (sendto(s, f, n, 0, (struct sockaddr *)&to, sizeof(to)) == (ssize_t)n) sent++;
        else { perror("sendto"); return 1; }
        usleep(2000);
    }
    printf("sent %ld\n", sent);
    return 0;
}

/*
 * vnic-mcast: join many multicast groups from a guest, timed, hold them, leave them, timed.
 *   vnic-mcast MODE IFNAME FIRST_GROUP COUNT HOLD_PORT HOLD_S [SOURCES]
 * MODE: ip      IP_ADD_MEMBERSHIP / IP_DROP_MEMBERSHIP
 *       group   MCAST_JOIN_GROUP / MCAST_LEAVE_GROUP (IPv4)
 *       source  MCAST_JOIN_SOURCE_GROUP / MCAST_LEAVE_SOURCE_GROUP, SOURCES sources per group
 *               (10.200.0.1, 10.200.0.2, ...; default 4)
 *       ipv6    IPV6_ADD_MEMBERSHIP / IPV6_DROP_MEMBERSHIP (FIRST_GROUP is IPv6)
 * Groups are FIRST_GROUP, FIRST_GROUP+1, ... (IPv6: counted in the low 32 bits). Prints
 * "VNIC-TIME join batch_end=N ms=T" every 500 groups and "VNIC-TIME join total=N ms=T", then
 * "VNIC-JOINED N", holds until a datagram arrives on UDP HOLD_PORT (or HOLD_S seconds), then
 * leaves, timed the same way, and prints "VNIC-LEFT N".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 500

enum mode { M_IP, M_GROUP, M_SOURCE, M_IPV6 };

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct ctx {
    enum mode mode;
    int s, ifindex, sources;
    uint32_t first4;
    struct in6_addr first6;
};

static void v4(struct sockaddr_storage *ss, uint32_t host_order) {
    struct sockaddr_in *sin = (struct sockaddr_in *)ss;
    memset(ss, 0, sizeof(*ss));
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = htonl(host_order);
}

/* One group's join or leave: one or more setsockopt calls. */
static int member(struct ctx *c, long i, int join) {
    switch (c->mode) {
    case M_IP: {
        struct ip_mreqn m = { .imr_multiaddr.s_addr = htonl(c->first4 + (uint32_t)i), .imr_ifindex = c->ifindex };
        return setsockopt(c->s, IPPROTO_IP, join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP, &m, sizeof(m));
    }
    case M_GROUP: {
        struct group_req g = { .gr_interface = (uint32_t)c->ifindex };
        v4(&g.gr_group, c->first4 + (uint32_t)i);
        return setsockopt(c->s, IPPROTO_IP, join ? MCAST_JOIN_GROUP : MCAST_LEAVE_GROUP, &g, sizeof(g));
    }
    case M_SOURCE:
        for (int k = 0; k < c->sources; k++) {
            struct group_source_req g = { .gsr_interface = (uint32_t)c->ifindex };
            v4(&g.gsr_group, c->first4 + (uint32_t)i);
            v4(&g.gsr_source, 0x0ac80001u + (uint32_t)k); /* 10.200.0.1 + k */
            int opt = join ? MCAST_JOIN_SOURCE_GROUP : MCAST_LEAVE_SOURCE_GROUP;
            if (setsockopt(c->s, IPPROTO_IP, opt, &g, sizeof(g)) < 0) return -1;
        }
        return 0;
    case M_IPV6: {
        struct ipv6_mreq m = { .ipv6mr_multiaddr = c->first6, .ipv6mr_interface = (unsigned)c->ifindex };
        uint32_t low;
        memcpy(&low, &m.ipv6mr_multiaddr.s6_addr[12], 4);
        low = htonl(ntohl(low) + (uint32_t)i);
        memcpy(&m.ipv6mr_multiaddr.s6_addr[12], &low, 4);
        return setsockopt(c->s, IPPROTO_IPV6, join ? IPV6_ADD_MEMBERSHIP : IPV6_DROP_MEMBERSHIP, &m, sizeof(m));
    }
    }
    return -1;
}

static int run(struct ctx *c, long count, int join) {
    const char *what = join ? "join" : "leave";
    double t0 = now_ms(), tb = t0;
    for (long i = 0; i < count; i++) {
        if (member(c, i, join) < 0) {
            fprintf(stderr, "%s %ld: %s\n", what, i, strerror(errno));
            return 1;
        }
        if ((i + 1) % BATCH == 0 || i + 1 == count) {
            double t = now_ms();
            printf("VNIC-TIME %s batch_end=%ld ms=%.2f\n", what, i + 1, t - tb);
            tb = t;
        }
    }
    printf("VNIC-TIME %s total=%ld ms=%.2f\n", what, count, now_ms() - t0);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 7 || argc > 8) {
        fprintf(stderr, "usage: vnic-mcast ip|group|source|ipv6 IFNAME FIRST_GROUP COUNT HOLD_PORT HOLD_S [SOURCES]\n");
        return 2;
    }
    struct ctx c = { .sources = argc == 8 ? atoi(argv[7]) : 4 };
    if (!strcmp(argv[1], "ip")) c.mode = M_IP;
    else if (!strcmp(argv[1], "group")) c.mode = M_GROUP;
    else if (!strcmp(argv[1], "source")) c.mode = M_SOURCE;
    else if (!strcmp(argv[1], "ipv6")) c.mode = M_IPV6;
    else { fprintf(stderr, "unknown mode %s\n", argv[1]); return 2; }
    c.ifindex = (int)if_nametoindex(argv[2]);
    int ok;
    if (c.mode == M_IPV6) {
        ok = inet_pton(AF_INET6, argv[3], &c.first6) == 1;
    } else {
        struct in_addr a;
        ok = inet_pton(AF_INET, argv[3], &a) == 1;
        c.first4 = ntohl(a.s_addr);
    }
    if (!c.ifindex || !ok || c.sources < 1) { fprintf(stderr, "bad interface, group or sources\n"); return 2; }
    long count = atol(argv[4]);
    c.s = socket(c.mode == M_IPV6 ? AF_INET6 : AF_INET, SOCK_DGRAM, 0);
    int h = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in me = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[5])) };
    if (c.s < 0 || h < 0 || bind(h, (struct sockaddr *)&me, sizeof(me)) < 0) { perror("socket"); return 1; }
    if (run(&c, count, 1)) return 1;
    printf("VNIC-JOINED %ld\n", count);
    fflush(stdout);
    struct pollfd p = { .fd = h, .events = POLLIN };
    poll(&p, 1, atoi(argv[6]) * 1000);
    if (run(&c, count, 0)) return 1;
    printf("VNIC-LEFT %ld\n", count);
    fflush(stdout);
    return 0;
}

/*
 * vnic-mcast-pair: IP_ADD_MEMBERSHIP joins, then leaves, on two interfaces of one guest in
 * alternating blocks, each block timed. Comparing two NICs this way cancels what separate
 * guests cannot: how fast the host runs this guest's code, which drifts from boot to boot
 * and over seconds.
 *   vnic-mcast-pair IF_A IF_B FIRST_GROUP COUNT BLOCK
 * Each interface joins groups FIRST_GROUP .. FIRST_GROUP+COUNT-1 through a socket of its
 * own, so both lists (the socket's and the device's) grow alike. Blocks of BLOCK joins run
 * in the order A B, B A, A B, ... so that neither interface always goes first; 20 ms of
 * sleep before each block lets the previous one's device go idle. Prints, for joins and
 * then leaves,
 *   VNIC-PAIR join block=K a_ms=T b_ms=T     one line per pair of blocks
 *   VNIC-PAIR join total=COUNT a_ms=T b_ms=T
 */
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct side {
    const char *name;
    int s, ifindex;
};

/* Joins or leaves groups [from, to) on one side; the elapsed ms, or -1 on error. */
static double block(const struct side *d, uint32_t first, long from, long to, int join) {
    double t0 = now_ms();
    for (long i = from; i < to; i++) {
        struct ip_mreqn m = { .imr_multiaddr.s_addr = htonl(first + (uint32_t)i), .imr_ifindex = d->ifindex };
        if (setsockopt(d->s, IPPROTO_IP, join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP, &m, sizeof(m)) < 0) {
            fprintf(stderr, "%s %ld on %s: %s\n", join ? "join" : "leave", i, d->name, strerror(errno));
            return -1;
        }
    }
    return now_ms() - t0;
}

static int run(const struct side sides[2], uint32_t first, long count, long size, int join) {
    const char *what = join ? "join" : "leave";
    double total[2] = { 0, 0 };
    for (long k = 0; k * size < count; k++) {
        long from = k * size, to = from + size < count ? from + size : count;
        double ms[2];
        for (int n = 0; n < 2; n++) {
            int who = (int)(k % 2) ^ n; /* A B, then B A */
            usleep(20000);
            ms[who] = block(&sides[who], first, from, to, join);
            if (ms[who] < 0) return 1;
            total[who] += ms[who];
        }
        printf("VNIC-PAIR %s block=%ld a_ms=%.3f b_ms=%.3f\n", what, k, ms[0], ms[1]);
    }
    printf("VNIC-PAIR %s total=%ld a_ms=%.2f b_ms=%.2f\n", what, count, total[0], total[1]);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: vnic-mcast-pair IF_A IF_B FIRST_GROUP COUNT BLOCK\n");
        return 2;
    }
    struct side sides[2] = { { .name = argv[1] }, { .name = argv[2] } };
    struct in_addr a;
    long count = atol(argv[4]), size = atol(argv[5]);
    if (inet_pton(AF_INET, argv[3], &a) != 1 || count < 1 || size < 1) {
        fprintf(stderr, "bad group, count or block size\n");
        return 2;
    }
    for (int n = 0; n < 2; n++) {
        sides[n].ifindex = (int)if_nametoindex(sides[n].name);
        if (!sides[n].ifindex) {
            fprintf(stderr, "no interface %s\n", sides[n].name);
            return 2;
        }
        sides[n].s = socket(AF_INET, SOCK_DGRAM, 0);
        if (sides[n].s < 0) {
            perror("socket");
            return 1;
        }
    }
    if (sides[0].ifindex == sides[1].ifindex) {
        fprintf(stderr, "IF_A and IF_B are the same interface\n");
        return 2;
    }
    uint32_t first = ntohl(a.s_addr);
    return run(sides, first, count, size, 1) || run(sides, first, count, size, 0);
}

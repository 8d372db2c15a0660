/*
 * vnic-mcast: join many multicast groups from a guest, timed, then hold them until told.
 *   vnic-mcast IFNAME FIRST_GROUP COUNT HOLD_PORT HOLD_S
 * Joins COUNT IPv4 groups FIRST_GROUP, FIRST_GROUP+1, ... on IFNAME with IP_ADD_MEMBERSHIP,
 * printing the time of every batch of 500 and the total; prints "VNIC-JOINED n", holds the
 * memberships until a datagram arrives on UDP HOLD_PORT (or HOLD_S seconds pass), then leaves
 * them all, timed the same way.
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

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int member(int s, int ifindex, uint32_t group, int join) {
    struct ip_mreqn m = { .imr_multiaddr.s_addr = htonl(group), .imr_ifindex = ifindex };
    return setsockopt(s, IPPROTO_IP, join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP, &m, sizeof(m));
}

static int run(int s, int ifindex, uint32_t first, long count, int join) {
    const char *what = join ? "join" : "leave";
    double t0 = now_ms(), tb = t0;
    for (long i = 0; i < count; i++) {
        if (member(s, ifindex, first + (uint32_t)i, join) < 0) {
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
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: vnic-mcast IFNAME FIRST_GROUP COUNT HOLD_PORT HOLD_S\n");
        return 2;
    }
    int ifindex = (int)if_nametoindex(argv[1]);
    struct in_addr first;
    if (!ifindex || inet_pton(AF_INET, argv[2], &first) != 1) {
        fprintf(stderr, "bad interface or group\n");
        return 2;
    }
    long count = atol(argv[3]);
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    int h = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in me = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[4])) };
    if (s < 0 || h < 0 || bind(h, (struct sockaddr *)&me, sizeof(me)) < 0) {
        perror("socket");
        return 1;
    }
    if (run(s, ifindex, ntohl(first.s_addr), count, 1)) return 1;
    printf("VNIC-JOINED %ld\n", count);
    fflush(stdout);
    struct pollfd p = { .fd = h, .events = POLLIN };
    poll(&p, 1, atoi(argv[5]) * 1000);
    if (run(s, ifindex, ntohl(first.s_addr), count, 0)) return 1;
    fflush(stdout);
    return 0;
}

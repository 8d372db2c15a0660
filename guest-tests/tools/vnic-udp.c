/*
 * vnic-udp: counted UDP exchange for dpaa-vnic guest tests (static, no libc extras).
 *   vnic-udp send ADDR PORT COUNT [SIZE [PPS [SPORT]]]
 *                                          send COUNT datagrams of SIZE bytes (default 64),
 *                                          at most PPS per second (default/0: unpaced),
 *                                          from source port SPORT (default: any)
 *   vnic-udp recv PORT COUNT TIMEOUT_S     receive until COUNT datagrams or timeout;
 *                                          prints "received N" (then the rate between the
 *                                          first and last datagram) and exits 0 only if
 *                                          N == COUNT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static int do_send(const char *addr, int port, long count, int size, long pps, int sport) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0) { perror("socket"); return 1; }
    if (sport > 0) {
        struct sockaddr_in me = { .sin_family = AF_INET, .sin_port = htons(sport) };
        if (bind(s, (struct sockaddr *)&me, sizeof(me)) < 0) { perror("bind"); return 1; }
    }
    struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(port) };
    if (inet_pton(AF_INET, addr, &to.sin_addr) != 1) { fprintf(stderr, "bad address %s\n", addr); return 2; }
    char buf[65536];
    if (size < 8 || size > (int)sizeof(buf)) { fprintf(stderr, "bad size %d\n", size); return 2; }
    memset(buf, 0xa5, sizeof(buf));
    long t0 = now_ms(), sent = 0;
    for (long i = 0; i < count; i++) {
        if (pps > 0) {
            /* Pace against the schedule, not per packet, so sleeps do not accumulate. */
            long due = t0 + (i * 1000L) / pps;
            long wait = due - now_ms();
            if (wait > 0) usleep(wait * 1000);
        }
        memcpy(buf, &i, sizeof(i));
        if (sendto(s, buf, size, 0, (struct sockaddr *)&to, sizeof(to)) == size) {
            sent++;
        } else if (errno == ENOBUFS || errno == EAGAIN) {
            i--; /* queue full: retry the same datagram */
            usleep(100);
        } else {
            perror("sendto");
            return 1;
        }
    }
    long ms = now_ms() - t0;
    printf("sent %ld in %ld ms (%.0f pps)\n", sent, ms, ms > 0 ? sent * 1000.0 / ms : 0.0);
    return 0;
}

static int do_recv(int port, long count, int timeout_s) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0) { perror("socket"); return 1; }
    int rcv = 4 << 20;
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
    struct sockaddr_in me = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY) };
    if (bind(s, (struct sockaddr *)&me, sizeof(me)) < 0) { perror("bind"); return 1; }
    printf("listening %d\n", port);
    fflush(stdout);
    char buf[65536];
    long got = 0, deadline = now_ms() + timeout_s * 1000L, first = 0, last = 0;
    while (got < count) {
        long left = deadline - now_ms();
        if (left <= 0) break;
        struct pollfd p = { .fd = s, .events = POLLIN };
        if (poll(&p, 1, (int)left) <= 0) continue;
        if (recv(s, buf, sizeof(buf), 0) >= 0) {
            last = now_ms();
            if (got++ == 0) first = last;
        }
    }
    printf("received %ld\n", got);
    if (got > 1 && last > first)
        printf("rate %.0f pps over %ld ms\n", (got - 1) * 1000.0 / (last - first), last - first);
    return got == count ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "send") == 0)
        return do_send(argv[2], atoi(argv[3]), atol(argv[4]), argc > 5 ? atoi(argv[5]) : 64,
                       argc > 6 ? atol(argv[6]) : 0, argc > 7 ? atoi(argv[7]) : 0);
    if (argc == 5 && strcmp(argv[1], "recv") == 0)
        return do_recv(atoi(argv[2]), atol(argv[3]), atoi(argv[4]));
    fprintf(stderr, "usage: vnic-udp send ADDR PORT COUNT [SIZE [PPS [SPORT]]] | recv PORT COUNT TIMEOUT_S\n");
    return 2;
}

/*
 * vnic-tcp: a TCP bulk transfer whose content the receiver checks byte by byte.
 *   vnic-tcp send ADDR PORT BYTES     connect, write BYTES of the pattern in 64 KiB writes
 *                                     (so the stack builds TSO frames), close; prints
 *                                     "sent N in MS ms"
 *   vnic-tcp recv PORT TIMEOUT_S      accept one connection, read to EOF; prints "listening
 *                                     PORT" first, then "received N bad M (RATE Mbit/s)";
 *                                     exits 0 only if N > 0 and M == 0
 * Byte i of the stream is a fixed function of i, so any reordering, loss or corruption
 * shows as bad bytes or a short count.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint8_t pattern(uint64_t i) {
    uint64_t x = i * 0x9e3779b97f4a7c15ull;
    return (uint8_t)(x >> 29);
}

static long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static int do_send(const char *addr, int port, long long bytes) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) { perror("socket"); return 1; }
    struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(port) };
    if (inet_pton(AF_INET, addr, &to.sin_addr) != 1) { fprintf(stderr, "bad address\n"); return 2; }
    if (connect(s, (struct sockaddr *)&to, sizeof(to)) < 0) { perror("connect"); return 1; }
    static uint8_t buf[65536];
    long t0 = now_ms();
    long long off = 0;
    while (off < bytes) {
        size_t n = bytes - off < (long long)sizeof(buf) ? (size_t)(bytes - off) : sizeof(buf);
        for (size_t k = 0; k < n; k++) buf[k] = pattern((uint64_t)(off + k));
        size_t done = 0;
        while (done < n) {
            ssize_t w = write(s, buf + done, n - done);
            if (w < 0) {
                if (errno == EINTR) continue;
                perror("write");
                return 1;
            }
            done += (size_t)w;
        }
        off += (long long)n;
    }
    shutdown(s, SHUT_WR);
    /* Wait for the receiver's close, so "sent" means delivered. */
    while (read(s, buf, sizeof(buf)) > 0) {}
    printf("sent %lld in %ld ms\n", off, now_ms() - t0);
    return 0;
}

static int do_recv(int port, int timeout_s) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0) { perror("socket"); return 1; }
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in me = { .sin_family = AF_INET, .sin_port = htons(port) };
    if (bind(l, (struct sockaddr *)&me, sizeof(me)) < 0 || listen(l, 1) < 0) { perror("bind/listen"); return 1; }
    printf("listening %d\n", port);
    fflush(stdout);
    struct pollfd p = { .fd = l, .events = POLLIN };
    if (poll(&p, 1, timeout_s * 1000) <= 0) { printf("received 0 bad 0 (no connection)\n"); return 1; }
    int s = accept(l, NULL, NULL);
    if (s < 0) { perror("accept"); return 1; }
    static uint8_t buf[65536];
    long long got = 0, bad = 0;
    long t0 = now_ms(), deadline = t0 + timeout_s * 1000L;
    for (;;) {
        struct pollfd q = { .fd = s, .events = POLLIN };
        long left = deadline - now_ms();
        if (left <= 0 || poll(&q, 1, (int)left) <= 0) { fprintf(stderr, "timeout\n"); bad++; break; }
        ssize_t n = read(s, buf, sizeof(buf));
        if (n < 0) { if (errno == EINTR) continue; perror("read"); bad++; break; }
        if (n == 0) break;
        for (ssize_t k = 0; k < n; k++)
            if (buf[k] != pattern((uint64_t)(got + k))) bad++;
        got += n;
    }
    long ms = now_ms() - t0;
    close(s);
    printf("received %lld bad %lld (%.1f Mbit/s)\n", got, bad, ms > 0 ? got * 8.0 / ms / 1000.0 : 0.0);
    return got > 0 && bad == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "send") == 0) return do_send(argv[2], atoi(argv[3]), atoll(argv[4]));
    if (argc == 4 && strcmp(argv[1], "recv") == 0) return do_recv(atoi(argv[2]), atoi(argv[3]));
    fprintf(stderr, "usage: vnic-tcp send ADDR PORT BYTES | recv PORT TIMEOUT_S\n");
    return 2;
}

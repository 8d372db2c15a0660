/*
 * vnic-churn: multicast membership churn from several threads at once, reproducible by seed.
 *   vnic-churn IFNAME SEED THREADS OPS CHECKPOINTS PORT [POOL [versions]]
 * Each thread owns three IPv4 and three IPv6 UDP sockets and performs OPS operations drawn
 * from its own generator (SEED and the thread's number): IP_ADD/DROP_MEMBERSHIP,
 * MCAST_JOIN/LEAVE_GROUP, MCAST_JOIN/LEAVE_SOURCE_GROUP, MCAST_BLOCK/UNBLOCK_SOURCE,
 * setsourcefilter (INCLUDE and EXCLUDE lists), the IPv6 equivalents, and closing a socket
 * that holds memberships (a new one takes its place). Groups come from a pool of POOL per
 * family (default 48), so several sockets join the same group; pool groups come in pairs that
 * map to one MAC (239.1.0.N and 239.129.0.N; ff15::1:1:N and ff15::2:1:N). Sources: 4 per
 * family. Failures (EADDRINUSE, EADDRNOTAVAIL, ENOBUFS, ...) are part of the workload and
 * counted by errno.
 * Each thread first fills one more IPv4 socket with pool groups until the kernel refuses
 * one (ENOBUFS past igmp_max_memberships) and closes it.
 * CHECKPOINTS times (evenly spaced) every thread stops; the tool prints
 *   VNIC-CHECKPOINT k ops=N ok=N failed=N enobufs=N ms=T churn_ms=C
 * (T since the start, C of it with the threads running, checkpoints left out)
 * then the interface's state (dev_mcast lines as "VNIC-MC k MAC", and the /proc/net/igmp,
 * igmp6, mcfilter and mcfilter6 lines for it as "VNIC-STATE k ..."), then the pool groups
 * the host's interface wants as "VNIC-INTEREST k GROUP": those some socket has joined in
 * EXCLUDE mode or with a non-empty INCLUDE list, read back from the sockets themselves
 * (getsourcefilter) and merged as RFC 3376 3.2 says an interface's state is. Then
 * "VNIC-WAIT k since_ms=D" (D: milliseconds since the last change, the threads' last
 * operation), and it waits for a datagram on UDP PORT (up to 600 s) before the threads go
 * on. After the last operations, with every socket still open, checkpoint CHECKPOINTS + 1
 * ("held"); then every socket is closed and checkpoint CHECKPOINTS + 2 ("closed") follows,
 * then "VNIC-CHURN-DONE ops=N".
 * With "versions", one more thread switches the interface's force_igmp_version between 2
 * and 3 and force_mld_version between 1 and 2 while the others churn, and puts both back
 * to 0 (the protocol's own choice) for every checkpoint.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SOCKS 3
#define SOURCES 4
#define MAX_THREADS 64

static const char *ifname;
static unsigned ifindex;
static int pool = 48;
static long ops_per_thread, per_checkpoint;
static int checkpoints, port;
static pthread_barrier_t stop, go;
static volatile int churning;
/* When the threads last changed a membership (now_ms), for VNIC-WAIT's since_ms. */
static double last_change;

struct tally {
    long ops, ok, failed, enobufs;
};

struct worker {
    int id;
    uint64_t rng;
    int s4[SOCKS], s6[SOCKS];
    struct tally t;
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* xorshift64*: small, fast, and the same sequence for the same seed everywhere. */
static uint64_t next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

static unsigned pick(struct worker *w, unsigned n) {
    return (unsigned)(next(&w->rng) % n);
}

static void group4(int i, struct sockaddr_storage *ss) {
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    memset(ss, 0, sizeof(*ss));
    a->sin_family = AF_INET;
    /* Pairs that differ only in the bit the 01:00:5e mapping drops. */
    a->sin_addr.s_addr = htonl((i & 1 ? 0xef810000u : 0xef010000u) | (uint32_t)(i / 2 + 1));
}

static void group6(int i, struct sockaddr_storage *ss) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
    memset(ss, 0, sizeof(*ss));
    a->sin6_family = AF_INET6;
    /* ff15::1:1:N and ff15::2:1:N: the same low 32 bits, the same MAC, 33:33:00:01:00:N
     * (clear of all-nodes' 33:33:00:00:00:01). */
    uint8_t *b = a->sin6_addr.s6_addr;
    b[0] = 0xff;
    b[1] = 0x15;
    b[11] = (uint8_t)(i & 1 ? 2 : 1);
    b[13] = 1;
    b[14] = (uint8_t)((i / 2 + 1) >> 8);
    b[15] = (uint8_t)(i / 2 + 1);
}

static void source4(int i, struct sockaddr_storage *ss) {
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    memset(ss, 0, sizeof(*ss));
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(0x0ac80001u + (uint32_t)i); /* 10.200.0.1.. */
}

static void source6(int i, struct sockaddr_storage *ss) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
    memset(ss, 0, sizeof(*ss));
    a->sin6_family = AF_INET6;
    uint8_t *b = a->sin6_addr.s6_addr; /* fd00:200::1.. */
    b[0] = 0xfd;
    b[2] = 0x02;
    b[15] = (uint8_t)(i + 1);
}

static int new_socket(int family) {
    int s = socket(family, SOCK_DGRAM, 0);
    if (s < 0) {
        perror("socket");
        exit(2);
    }
    return s;
}

static void record(struct worker *w, int r) {
    w->t.ops++;
    if (r == 0) {
        w->t.ok++;
    } else {
        w->t.failed++;
        if (errno == ENOBUFS || errno == ENOMEM) w->t.enobufs++;
    }
}

/* One operation of worker w. */
static void op(struct worker *w) {
    int v6 = (int)pick(w, 2);
    int si = (int)pick(w, SOCKS);
    int *sock = v6 ? &w->s6[si] : &w->s4[si];
    int level = v6 ? IPPROTO_IPV6 : IPPROTO_IP;
    int family = v6 ? AF_INET6 : AF_INET;
    int g = (int)pick(w, (unsigned)pool);
    int src = (int)pick(w, SOURCES);
    struct group_req gr = { .gr_interface = ifindex };
    struct group_source_req gsr = { .gsr_interface = ifindex };
    if (v6) {
        group6(g, &gr.gr_group);
        group6(g, &gsr.gsr_group);
        source6(src, &gsr.gsr_source);
    } else {
        group4(g, &gr.gr_group);
        group4(g, &gsr.gsr_group);
        source4(src, &gsr.gsr_source);
    }
    switch (pick(w, 10)) {
    case 0: /* the old API: IP_ADD_MEMBERSHIP / IPV6_ADD_MEMBERSHIP */
    case 1: {
        int join = pick(w, 2) == 0;
        if (v6) {
            struct ipv6_mreq m = { .ipv6mr_multiaddr = ((struct sockaddr_in6 *)&gr.gr_group)->sin6_addr,
                                   .ipv6mr_interface = ifindex };
            record(w, setsockopt(*sock, level, join ? IPV6_ADD_MEMBERSHIP : IPV6_DROP_MEMBERSHIP, &m, sizeof(m)));
        } else {
            struct ip_mreqn m = { .imr_multiaddr = ((struct sockaddr_in *)&gr.gr_group)->sin_addr,
                                  .imr_ifindex = (int)ifindex };
            record(w, setsockopt(*sock, level, join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP, &m, sizeof(m)));
        }
        break;
    }
    case 2:
        record(w, setsockopt(*sock, level, MCAST_JOIN_GROUP, &gr, sizeof(gr)));
        break;
    case 3:
        record(w, setsockopt(*sock, level, MCAST_LEAVE_GROUP, &gr, sizeof(gr)));
        break;
    case 4:
        record(w, setsockopt(*sock, level, MCAST_JOIN_SOURCE_GROUP, &gsr, sizeof(gsr)));
        break;
    case 5:
        record(w, setsockopt(*sock, level, MCAST_LEAVE_SOURCE_GROUP, &gsr, sizeof(gsr)));
        break;
    case 6:
        record(w, setsockopt(*sock, level, MCAST_BLOCK_SOURCE, &gsr, sizeof(gsr)));
        break;
    case 7:
        record(w, setsockopt(*sock, level, MCAST_UNBLOCK_SOURCE, &gsr, sizeof(gsr)));
        break;
    case 8: {
        /* A whole source list at once, INCLUDE or EXCLUDE, 0 to 3 sources. */
        struct sockaddr_storage list[SOURCES];
        unsigned n = pick(w, 4);
        for (unsigned k = 0; k < n; k++) {
            if (v6)
                source6((int)((unsigned)src + k) % SOURCES, &list[k]);
            else
                source4((int)((unsigned)src + k) % SOURCES, &list[k]);
        }
        uint32_t mode = pick(w, 2) ? MCAST_INCLUDE : MCAST_EXCLUDE;
        record(w, setsourcefilter(*sock, ifindex, (struct sockaddr *)&gr.gr_group,
                                  v6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in), mode, n, list));
        break;
    }
    default:
        /* Close the socket with whatever it holds; a new one takes its place. */
        close(*sock);
        *sock = new_socket(family);
        record(w, 0);
        break;
    }
}

/* Before churning: one more IPv4 socket joins the pool's groups in order until the kernel
 * refuses one (igmp_max_memberships per socket: 20 by default, 8 with churn.sh's maxmem
 * knob) or the pool runs out, then closes. So every run meets ENOBUFS when the pool is
 * larger than the limit, whatever the seed draws afterwards. */
static void fill(struct worker *w) {
    int s = new_socket(AF_INET);
    for (int i = 0; i < pool; i++) {
        struct sockaddr_storage g;
        group4(i, &g);
        struct ip_mreqn m = {.imr_multiaddr = ((struct sockaddr_in *)&g)->sin_addr, .imr_ifindex = (int)ifindex};
        int r = setsockopt(s, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof(m));
        record(w, r);
        if (r != 0) break;
    }
    close(s);
}

static void *run(void *arg) {
    struct worker *w = arg;
    fill(w);
    for (int c = 0; c < checkpoints; c++) {
        for (long i = 0; i < per_checkpoint; i++) op(w);
        pthread_barrier_wait(&stop);
        pthread_barrier_wait(&go);
    }
    for (long i = (long)checkpoints * per_checkpoint; i < ops_per_thread; i++) op(w);
    pthread_barrier_wait(&stop);
    pthread_barrier_wait(&go);
    for (int k = 0; k < SOCKS; k++) {
        close(w->s4[k]);
        close(w->s6[k]);
        w->s4[k] = w->s6[k] = -1;
    }
    pthread_barrier_wait(&stop);
    return NULL;
}

/* The lines of FILE about the interface: those naming it, and for /proc/net/igmp the group
 * lines (indented) under the interface's own line. */
static void dump(int k, const char *file) {
    FILE *f = fopen(file, "r");
    if (!f) return;
    int igmp = strcmp(file, "/proc/net/igmp") == 0, ours = 0;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        int named = strstr(line, ifname) != NULL;
        if (igmp && line[0] != '\t') ours = named;
        if (igmp ? ours : named) printf("VNIC-STATE %d %s %s\n", k, strrchr(file, '/') + 1, line);
    }
    fclose(f);
}

/* Whether socket s holds group g with an interest: EXCLUDE mode, or INCLUDE with sources. */
static int wants(int s, struct sockaddr_storage *g, int v6) {
    uint32_t mode, n = SOURCES * 4;
    struct sockaddr_storage list[SOURCES * 4];
    socklen_t len = v6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (getsourcefilter(s, ifindex, (struct sockaddr *)g, len, &mode, &n, list) != 0) return 0;
    return mode == MCAST_EXCLUDE || n > 0;
}

/* The pool groups the interface wants, from every socket's own filter. */
static void interest(int k, struct worker *ws, int n) {
    char text[INET6_ADDRSTRLEN];
    for (int v6 = 0; v6 < 2; v6++) {
        for (int i = 0; i < pool; i++) {
            struct sockaddr_storage g;
            if (v6)
                group6(i, &g);
            else
                group4(i, &g);
            int wanted = 0;
            for (int t = 0; t < n && !wanted; t++)
                for (int j = 0; j < SOCKS && !wanted; j++) wanted = wants(v6 ? ws[t].s6[j] : ws[t].s4[j], &g, v6);
            if (!wanted) continue;
            const void *a = v6 ? (const void *)&((struct sockaddr_in6 *)&g)->sin6_addr
                               : (const void *)&((struct sockaddr_in *)&g)->sin_addr;
            inet_ntop(v6 ? AF_INET6 : AF_INET, a, text, sizeof(text));
            printf("VNIC-INTEREST %d %s\n", k, text);
        }
    }
}

static double churn_ms;

static void checkpoint(int k, struct worker *ws, int n, double t0) {
    struct tally t = { 0 };
    for (int i = 0; i < n; i++) {
        t.ops += ws[i].t.ops;
        t.ok += ws[i].t.ok;
        t.failed += ws[i].t.failed;
        t.enobufs += ws[i].t.enobufs;
    }
    printf("VNIC-CHECKPOINT %d ops=%ld ok=%ld failed=%ld enobufs=%ld ms=%.1f churn_ms=%.1f\n", k, t.ops, t.ok,
           t.failed, t.enobufs, now_ms() - t0, churn_ms);
    FILE *f = fopen("/proc/net/dev_mcast", "r");
    char line[256];
    while (f && fgets(line, sizeof(line), f)) {
        char dev[64], mac[64];
        int idx, users, global;
        if (sscanf(line, "%d %63s %d %d %63s", &idx, dev, &users, &global, mac) == 5 && !strcmp(dev, ifname))
            printf("VNIC-MC %d %s\n", k, mac);
    }
    if (f) fclose(f);
    dump(k, "/proc/net/igmp");
    dump(k, "/proc/net/mcfilter");
    dump(k, "/proc/net/igmp6");
    dump(k, "/proc/net/mcfilter6");
    interest(k, ws, n);
    printf("VNIC-WAIT %d since_ms=%.0f\n", k, now_ms() - last_change);
    fflush(stdout);
}

static void set_sysctl(const char *fmt, int v) {
    char path[128];
    snprintf(path, sizeof(path), fmt, ifname);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%d\n", v);
        fclose(f);
    }
}

static void versions_auto(void) {
    set_sysctl("/proc/sys/net/ipv4/conf/%s/force_igmp_version", 0);
    set_sysctl("/proc/sys/net/ipv6/conf/%s/force_mld_version", 0);
}

/* Switches the protocol versions every 20 ms while the workers churn. */
static void *versions(void *arg) {
    (void)arg;
    int v = 2;
    for (;;) {
        if (churning) {
            set_sysctl("/proc/sys/net/ipv4/conf/%s/force_igmp_version", v);
            set_sysctl("/proc/sys/net/ipv6/conf/%s/force_mld_version", v - 1);
            v = 5 - v;
        }
        usleep(20000);
    }
    return NULL;
}

/* Waits for the host's datagram on the continue port. */
static int wait_host(int s) {
    struct pollfd p = { .fd = s, .events = POLLIN };
    if (poll(&p, 1, 600 * 1000) != 1) return -1;
    char b[64];
    return recv(s, b, sizeof(b), 0) < 0 ? -1 : 0;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: vnic-churn IFNAME SEED THREADS OPS CHECKPOINTS PORT [POOL]\n");
        return 2;
    }
    ifname = argv[1];
    uint64_t seed = strtoull(argv[2], NULL, 0);
    int threads = atoi(argv[3]);
    ops_per_thread = atol(argv[4]);
    checkpoints = atoi(argv[5]);
    port = atoi(argv[6]);
    if (argc > 7) pool = atoi(argv[7]);
    int switch_versions = argc > 8 && !strcmp(argv[8], "versions");
    ifindex = if_nametoindex(ifname);
    if (!ifindex || threads < 1 || threads > MAX_THREADS || checkpoints < 0 || pool < 2 || pool > 1000) {
        fprintf(stderr, "vnic-churn: bad arguments\n");
        return 2;
    }
    per_checkpoint = ops_per_thread / (checkpoints + 1);
    int cs = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    if (cs < 0 || bind(cs, (struct sockaddr *)&a, sizeof(a)) < 0) {
        perror("bind");
        return 2;
    }
    printf("VNIC-CHURN seed=%llu threads=%d ops=%ld checkpoints=%d pool=%d\n", (unsigned long long)seed, threads,
           ops_per_thread, checkpoints, pool);
    fflush(stdout);
    struct worker *ws = calloc((size_t)threads, sizeof(*ws));
    pthread_t *tid = calloc((size_t)threads, sizeof(*tid));
    pthread_barrier_init(&stop, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&go, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        ws[i].id = i;
        /* Never zero: xorshift would stay there. */
        ws[i].rng = (seed ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1))) | 1;
        for (int k = 0; k < SOCKS; k++) {
            ws[i].s4[k] = new_socket(AF_INET);
            ws[i].s6[k] = new_socket(AF_INET6);
        }
    }
    double t0 = now_ms(), went = t0;
    churning = 1;
    if (switch_versions) {
        pthread_t vt;
        pthread_create(&vt, NULL, versions, NULL);
    }
    for (int i = 0; i < threads; i++) pthread_create(&tid[i], NULL, run, &ws[i]);
    for (int c = 1; c <= checkpoints + 1; c++) {
        pthread_barrier_wait(&stop);
        churn_ms += now_ms() - went;
        churning = 0;
        if (switch_versions) {
            usleep(50000); /* the switcher's last write is done */
            versions_auto();
        }
        last_change = now_ms();
        checkpoint(c, ws, threads, t0);
        if (wait_host(cs) < 0) {
            fprintf(stderr, "vnic-churn: no word from the host at checkpoint %d\n", c);
            return 1;
        }
        went = now_ms();
        /* After the held checkpoint the threads only close their sockets. */
        churning = c <= checkpoints;
        pthread_barrier_wait(&go);
    }
    pthread_barrier_wait(&stop);
    last_change = now_ms();
    for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
    /* Every socket closed (-1): no group is wanted. */
    checkpoint(checkpoints + 2, ws, threads, t0);
    if (wait_host(cs) < 0) return 1;
    long total = 0;
    for (int i = 0; i < threads; i++) total += ws[i].t.ops;
    printf("VNIC-CHURN-DONE ops=%ld\n", total);
    return 0;
}

/*
 * vnic-flags: the control queue's round trip as a guest sees it. Toggles IFF_ALLMULTI on
 * IFNAME COUNT times (SIOCSIFFLAGS); with the 6.1 driver each toggle sends its rx-mode
 * commands synchronously (PROMISC, ALLMULTI, MAC_TABLE_SET), busy-waiting on each ack.
 *   vnic-flags IFNAME COUNT [each]
 * Prints "VNIC-TIME flags total=COUNT ms=T"; with "each", first "VNIC-TOGGLE I US" for each
 * toggle.
 */
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4 || (argc == 4 && strcmp(argv[3], "each"))) {
        fprintf(stderr, "usage: vnic-flags IFNAME COUNT [each]\n");
        return 2;
    }
    int each = argc == 4;
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    strncpy(ifr.ifr_name, argv[1], IFNAMSIZ - 1);
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0) {
        perror("SIOCGIFFLAGS");
        return 1;
    }
    long count = atol(argv[2]);
    double t0 = now_ms();
    for (long i = 0; i < count; i++) {
        double a = now_ms();
        ifr.ifr_flags ^= IFF_ALLMULTI;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) {
            perror("SIOCSIFFLAGS");
            return 1;
        }
        if (each)
            printf("VNIC-TOGGLE %ld %.0f\n", i, (now_ms() - a) * 1000);
    }
    printf("VNIC-TIME flags total=%ld ms=%.2f\n", count, now_ms() - t0);
    return 0;
}

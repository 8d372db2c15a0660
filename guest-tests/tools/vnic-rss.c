/*
 * vnic-rss: sets a NIC's RSS indirection table through the ethtool ioctl, as
 * `ethtool -X IFACE` would, so the driver sends VIRTIO_NET_CTRL_MQ_RSS_CONFIG.
 *   vnic-rss IFACE QUEUES SHIFT [KEY]    entry i = (i + SHIFT) % QUEUES
 * KEY (hex, as long as the driver's key) replaces the driver's key, which Linux draws at
 * random once per boot (netdev_rss_key_fill): a test that predicts queues from a fixed key
 * gets the same spread every run. Without KEY the driver's key is kept.
 * Prints the table size and key size; exits 3 if the driver has no RSS (EOPNOTSUPP).
 */
#include <errno.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: vnic-rss IFACE QUEUES SHIFT [KEY]\n");
        return 2;
    }
    unsigned queues = (unsigned)atoi(argv[2]), shift = (unsigned)atoi(argv[3]);
    if (queues == 0) { fprintf(stderr, "vnic-rss: QUEUES must be > 0\n"); return 2; }
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0) { perror("socket"); return 1; }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", argv[1]);

    /* First ask for the sizes. */
    struct ethtool_rxfh probe;
    memset(&probe, 0, sizeof(probe));
    probe.cmd = ETHTOOL_GRSSH;
    ifr.ifr_data = (void *)&probe;
    if (ioctl(s, SIOCETHTOOL, &ifr) < 0) {
        perror("ETHTOOL_GRSSH");
        return errno == EOPNOTSUPP ? 3 : 1;
    }
    unsigned n = probe.indir_size;
    printf("rss: indirection table %u entries, key %u bytes\n", n, probe.key_size);
    if (n == 0) return 3;

    const char *hex = argc == 5 ? argv[4] : NULL;
    unsigned key_size = 0; /* 0: keep the key */
    if (hex) {
        if (strlen(hex) != 2 * (size_t)probe.key_size) {
            fprintf(stderr, "vnic-rss: KEY has %zu hex digits, the driver's key %u bytes\n",
                    strlen(hex), probe.key_size);
            return 2;
        }
        key_size = probe.key_size;
    }
    /* The table, then the key right after it (struct ethtool_rxfh, linux/ethtool.h). */
    size_t len = sizeof(struct ethtool_rxfh) + n * sizeof(__u32) + key_size;
    struct ethtool_rxfh *set = calloc(1, len);
    if (!set) return 1;
    set->cmd = ETHTOOL_SRSSH;
    set->indir_size = n;
    set->key_size = key_size;
    for (unsigned i = 0; i < n; i++) set->rss_config[i] = (i + shift) % queues;
    unsigned char *key = (unsigned char *)&set->rss_config[n];
    for (unsigned i = 0; i < key_size; i++) {
        unsigned byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1) {
            fprintf(stderr, "vnic-rss: KEY is not hex\n");
            return 2;
        }
        key[i] = (unsigned char)byte;
    }
    ifr.ifr_data = (void *)set;
    if (ioctl(s, SIOCETHTOOL, &ifr) < 0) {
        perror("ETHTOOL_SRSSH");
        return errno == EOPNOTSUPP ? 3 : 1;
    }
    printf("rss: table set, entry i -> (i + %u) %% %u%s\n", shift, queues, hex ? ", key set" : "");
    return 0;
}

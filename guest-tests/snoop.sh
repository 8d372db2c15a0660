#!/usr/bin/env bash
# The net attachment with --snoop: QEMU keeps the control queue (its own table stops at 64
# entries), dpaa-vnic learns the guest's groups from the IGMPv3 and MLDv2 reports the guest
# sends. The checks of mcast-scale.sh apply unchanged: the daemon's table equals the guest's
# /proc/net/dev_mcast while 2000 (and 10 000) groups are held and after they are left, with
# exactly one filter add per join and one remove per leave, for every join API and for IPv6.
# vnic-kernels: bookworm trixie-bpo
set -euo pipefail
export VNIC_SCALE_ATTACH=net
export VNIC_SCALE_DAEMON_ARGS=--snoop
export VNIC_SCALE_FILTER=dtsec-ext
export VNIC_SCALE_CASES=${VNIC_SNOOP_CASES:-"ip 239.1.0.1 2000;group 239.2.0.1 500;source 239.3.0.1 500 4;ipv6 ff15::1:0 2000;ip 239.4.0.1 10000"}
exec bash "$(dirname "$0")/mcast-scale.sh"

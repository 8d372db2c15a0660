#!/usr/bin/env bash
# --snoop with --snoop-timeout: snooped groups expire unless refreshed, and dpaa-vnic, as
# the querier, sends IGMPv3 and MLDv2 general queries every third of the timeout. Groups the
# guest holds for three times the timeout must still all be in the filter (the guest's
# answers refreshed them), and leave when the guest leaves them.
set -euo pipefail
export VNIC_SCALE_ATTACH=net
export VNIC_SCALE_DAEMON_ARGS="--snoop --snoop-timeout 3"
export VNIC_SCALE_HOLD_S=9
export VNIC_SCALE_CASES=${VNIC_QUERIER_CASES:-"ip 239.1.0.1 200;ipv6 ff15::1:0 100"}
exec bash "$(dirname "$0")/mcast-scale.sh"

#!/usr/bin/env bash
# Four guests churning on one daemon at once (guest-tests/churn.sh), two in each
# attachment, with IGMP/MLD versions switched under them and igmp_max_memberships at 8 (joins
# past it fail with ENOBUFS): each port's filter follows its own guest only.
# vnic-kernels: bookworm trixie-bpo
set -euo pipefail
export VNIC_CHURN_GUESTS=${VNIC_CHURN_GUESTS:-"device snoop snoop device"}
export VNIC_CHURN_KNOBS=${VNIC_CHURN_KNOBS:-"versions maxmem"}
exec bash "$(dirname "$0")/churn.sh"

#!/usr/bin/env bash
# Churn (guest-tests/churn.sh) on two net-attachment guests whose filters follow QEMU's own
# table over QMP (--qmp), with optmem_max left at its default and a querier-free daemon.
set -euo pipefail
export VNIC_CHURN_GUESTS=${VNIC_CHURN_GUESTS:-"qmp qmp"}
export VNIC_CHURN_KNOBS=${VNIC_CHURN_KNOBS:-"optmem"}
exec bash "$(dirname "$0")/churn.sh"

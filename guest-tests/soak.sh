#!/usr/bin/env bash
# A short soak (scripts/soak): six QEMU guests in turn on one port, device and net, a
# long-lived guest pinging through another, the daemon restarted once under its
# reconnecting QEMU; descriptors, threads and RSS must stay flat. `scripts/soak 100` is
# the long run.
set -euo pipefail
exec "$(dirname "$0")/../scripts/soak" 6 3

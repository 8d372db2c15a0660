# Shared helpers for dpaa-vnic scripts. Sourced, never run.
# shellcheck shell=bash

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# rustup installs cargo here (scripts/provision does when the system has none recent enough),
# and a login shell may not have it on PATH yet. First on PATH even before it exists: a
# script that provisions and then builds (scripts/run, scripts/test) finds the cargo just
# installed, ahead of a distribution's older one.
[[ :$PATH: != *:$HOME/.cargo/bin:* ]] && PATH=$HOME/.cargo/bin:$PATH

# The running script, wherever it later cd's to.
SCRIPT_PATH=$(realpath "$0")
# script_help: the running script's leading comment block, its documentation.
script_help() {
    awk 'NR == 1 { next } !/^#/ { exit } /^# shellcheck/ { next } { sub(/^# ?/, ""); print }' "$SCRIPT_PATH"
}
# Every script (and guest scenario) answers -h/--help with that block, before doing anything:
# this file is sourced without arguments, so "$1" is the script's own first argument.
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    script_help
    exit 0
fi
# Everything fetched or built for guests lives here (ignored by git).
CACHE_DIR=${VNIC_CACHE:-$REPO_ROOT/.cache}
# The trixie rootfs that carries QEMU >= 10.2 (needed for the device attachment).
QEMU_ROOT=$CACHE_DIR/qemu-root
# A bookworm rootfs with systemd as PID 1, packed as an initramfs (scripts/provision).
SYSTEMD_CPIO=$CACHE_DIR/systemd-root.cpio
# Guest kernels: bookworm (Debian 12's 6.1, without the igmp mc_hash change) and trixie-bpo
# (trixie-backports' 7.x, with it). VNIC_KERNEL picks the one a guest boots.
GUEST_KERNELS=(bookworm trixie-bpo)
# VNIC_KERNEL may also be a path (anything with a '/'): your own kernel, a bzImage or an ELF
# vmlinux, with virtio-net built in or its modules under VNIC_KERNEL_MODULES (a
# /lib/modules/VERSION tree, or any directory holding the .ko files). scripts/provision
# prepares it like the named ones, again whenever the file changes.
VNIC_KERNEL=${VNIC_KERNEL:-bookworm}
# kernel_key KERNEL: the name a kernel's guest files go under (a path gets a hash of itself).
kernel_key() {
    case $1 in
        */*) echo "custom-$(realpath -m "$1" | sha256sum | cut -c1-12)" ;;
        *) echo "$1" ;;
    esac
}
KERNEL_KEY=$(kernel_key "$VNIC_KERNEL")
guest_dir() { echo "$CACHE_DIR/guest-$(kernel_key "$1")"; }
GUEST_DIR=$(guest_dir "$VNIC_KERNEL")

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# wait_for TIMEOUT_S DESCRIPTION COMMAND...: poll COMMAND every 0.1 s until it succeeds.
wait_for() {
    local timeout=$1 what=$2; shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "timed out after ${timeout}s waiting for $what"
            return 1
        fi
        sleep 0.1
    done
}

# median X...: the median of the values.
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
# median_interval X...: a 95 % confidence interval for the median the values are drawn from,
# without assuming a distribution: the order statistics x(k) and x(n+1-k), k the largest
# with P(Binomial(n, 1/2) < k) <= 2.5 %. "-" below 6 values, where no such k exists.
median_interval() {
    printf '%s\n' "$@" | sort -g | awk '{ x[NR] = $1 }
        END {
            n = NR; p = 0.5 ^ n; cdf = p; k = 0
            # cdf = P(X <= i); x(i + 1) is a lower bound while P(X <= i) stays within 2.5 %.
            for (i = 0; i < n && cdf <= 0.025; i++) { k = i + 1; p = p * (n - i) / (i + 1); cdf += p }
            if (k == 0) print "-"; else printf "%.3f-%.3f\n", x[k], x[n + 1 - k]
        }'
}

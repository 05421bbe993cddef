#!/bin/sh
# RabbitMQ 4.3 for benchmarks/durable.py (issue 27): a minimal Debian forky (testing) chroot with
# Debian's rabbitmq-server 4.3 on Erlang 29, under an ignored folder of the checkout.
#
#     sudo benchmarks/rabbitmq/setup-chroot.sh [DIR]      (default: build/rabbitmq-4.3 at the checkout's root)
#
# Idempotent: a chroot that already has rabbitmq-server is left as it is; a debootstrap that did
# not finish is started again.  Prints the installed version last.  Needs root (debootstrap, chroot,
# mounts), the network to a Debian mirror ($DEBIAN_MIRROR, default http://deb.debian.org/debian),
# and Debian's debootstrap package on the host (installed with apt-get if missing).  bookworm's
# debootstrap has no script for forky, so the sid script is used.  A benchmark dependency only:
# neither CI nor the test suite uses it.
set -eu

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${1:-${RABBITMQ_CHROOT:-$ROOT/build/rabbitmq-4.3}}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=forky
WANT=4.3
DONE=$DIR/.debootstrap-done

version() {
    chroot "$DIR" dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || true
}

if [ "$(id -u)" != 0 ]; then
    echo "setup-chroot.sh: run as root (debootstrap, chroot and mounts need it)" >&2
    exit 1
fi

if [ -f "$DONE" ] && [ -x "$DIR/usr/lib/rabbitmq/bin/rabbitmq-server" ] && [ -f "$DIR/etc/hosts" ]; then
    have=$(version)
    case "$have" in
        "$WANT".*) echo "rabbitmq-server $have in $DIR (already set up)"; exit 0 ;;
    esac
fi

if ! command -v debootstrap >/dev/null 2>&1; then
    apt-get install -y debootstrap || { apt-get update && apt-get install -y debootstrap; }
fi
SCRIPT=/usr/share/debootstrap/scripts/$SUITE
[ -e "$SCRIPT" ] || SCRIPT=/usr/share/debootstrap/scripts/sid

if [ ! -f "$DONE" ]; then
    if [ -d "$DIR/debootstrap" ]; then  # debootstrap's own work folder: a run of it that did not finish
        echo "removing the unfinished chroot $DIR"
        rm -rf --one-file-system "$DIR"
    elif [ -e "$DIR" ] && [ -n "$(ls -A "$DIR" 2>/dev/null)" ]; then
        echo "setup-chroot.sh: $DIR exists and is not a chroot this script began; move it away first" >&2
        exit 1
    fi
    mkdir -p "$(dirname "$DIR")"
    debootstrap --variant=minbase "$SUITE" "$DIR" "$MIRROR" "$SCRIPT"
    touch "$DONE"
fi

# No service may start inside the chroot while packages are installed.
printf '#!/bin/sh\nexit 101\n' > "$DIR/usr/sbin/policy-rc.d"
chmod 755 "$DIR/usr/sbin/policy-rc.d"
# The nodes are NAME@localhost: minbase has no /etc/hosts.
[ -f "$DIR/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$DIR/etc/hosts"
# The testing suite's Release file may be past its Valid-Until on a snapshot mirror.
echo 'Acquire::Check-Valid-Until "false";' > "$DIR/etc/apt/apt.conf.d/99hastandby-no-valid-until"

# apt inside the chroot, with /proc /dev /sys bound in a private mount namespace (nothing is left mounted).
unshare -m sh -eu -c '
    dir=$1
    for fs in proc dev sys; do mount --rbind "/$fs" "$dir/$fs"; mount --make-rslave "$dir/$fs"; done
    cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
    chroot "$dir" env DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Check-Valid-Until=false update
    chroot "$dir" env DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Check-Valid-Until=false \
        install -y --no-install-recommends rabbitmq-server
    chroot "$dir" apt-get clean
' sh "$DIR"

have=$(version)
case "$have" in
    "$WANT".*) ;;
    *) echo "setup-chroot.sh: $DIR has rabbitmq-server '${have:-none}', not $WANT.x" >&2; exit 1 ;;
esac
echo "rabbitmq-server $have in $DIR"

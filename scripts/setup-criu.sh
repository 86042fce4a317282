#!/usr/bin/env bash
# CRIU for container checkpoints (docs/checkpoint.md "Containers"), built from
# Debian's own source package of the testing suite and installed as
# /usr/local/sbin/criu.
#
# Why not bookworm's criu package: CRIU 3.17 stops at kernel feature detection
# on kernels 6.13 and newer (the [vvar_vclock] mapping; criu issue 2532, fixed
# in 4.1), and 4.1 fails to dump a TCP socket on kernels that refuse
# SO_PASSCRED on non-unix sockets (6.18 here; CRIU 4.2 asks only unix and
# netlink sockets). scripts/checkpoint/criu-repro.sh shows both.
#
# The source comes from deb.debian.org like every other package: InRelease is
# checked with gpgv against the host's Debian archive keyring, Sources.xz
# against InRelease's SHA256, the upstream tarball against Sources'. Only the
# upstream tarball (criu_X.orig.tar.xz, byte for byte what Debian builds from)
# is used: the package's debian.tar.xz holds packaging, and this machine's
# package mirror does not serve it. Downloads
# and the build are cached under $HPVC_CACHE (default /var/cache/hpvc), so a
# second run on the same machine is a version check. Idempotent; root only.
set -euo pipefail

SUITE=${HPVC_CRIU_SUITE:-testing}
MIRROR=${HPVC_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${HPVC_CACHE:-/var/cache/hpvc}/criu
MIN_VERSION=4.2
DEST=/usr/local/sbin/criu
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
BUILD_DEPS=(libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev
  libnl-3-dev libprotobuf-c-dev libprotobuf-dev pkg-config protobuf-c-compiler
  protobuf-compiler uuid-dev gpgv xz-utils curl)

say() { echo "hpvc setup (criu): $*" >&2; }

# Already there and new enough: nothing to do (no network, no apt).
if [ -x "$DEST" ]; then
  have=$("$DEST" --version 2>/dev/null | sed -n 's/^Version: //p')
  if [ -n "$have" ] && dpkg --compare-versions "$have" ge "$MIN_VERSION"; then
    exit 0
  fi
fi
if [ "$(id -u)" != 0 ]; then
  say "CRIU $MIN_VERSION or newer missing (run 'sudo make setup')"
  exit 2
fi

missing=()
for p in "${BUILD_DEPS[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing build dependencies ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$CACHE"
cd "$CACHE"
fetch() { curl -fsS --retry 3 -m 300 -o "$2" "$1"; }

# The suite's signed index, then the criu entry of its Sources.
fetch "$MIRROR/dists/$SUITE/InRelease" InRelease.new
gpgv --keyring "$KEYRING" InRelease.new 2>/dev/null ||
  { say "InRelease of $SUITE failed its signature check against $KEYRING"; exit 1; }
mv InRelease.new InRelease
want=$(awk '/^SHA256:/{s=1;next} /^[A-Za-z]/{s=0} s&&$3=="main/source/Sources.xz"{print $1}' InRelease)
fetch "$MIRROR/dists/$SUITE/main/source/Sources.xz" Sources.xz
echo "$want  Sources.xz" | sha256sum -c --quiet - ||
  { say "Sources.xz does not match $SUITE's InRelease"; exit 1; }
entry=$(xz -dc Sources.xz | awk -v RS= '/(^|\n)Package: criu\n/')
version=$(printf '%s\n' "$entry" | sed -n 's/^Version: //p' | head -1)
dir=$(printf '%s\n' "$entry" | sed -n 's/^Directory: //p' | head -1)
upstream=${version%-*}
if ! dpkg --compare-versions "$upstream" ge "$MIN_VERSION"; then
  say "Debian $SUITE has criu $version; hpvc needs $MIN_VERSION or newer"
  exit 1
fi
files=$(printf '%s\n' "$entry" | awk '/^Checksums-Sha256:/{s=1;next} /^[A-Za-z]/{s=0} s{print $1, $3}')

src=$CACHE/criu-$version
if [ ! -x "$src/criu/criu" ]; then
  say "building CRIU $version from Debian $SUITE's source package (about a minute)"
  read -r sum name < <(printf '%s\n' "$files" | awk '$2 ~ /\.orig\.tar\.[a-z0-9]+$/')
  if ! { [ -f "$name" ] && echo "$sum  $name" | sha256sum -c --quiet - 2>/dev/null; }; then
    fetch "$MIRROR/$dir/$name" "$name"
    echo "$sum  $name" | sha256sum -c --quiet - || { say "$name does not match Sources"; exit 1; }
  fi
  rm -rf "$src" "$src.tmp"
  mkdir "$src.tmp"
  tar -xf "$name" -C "$src.tmp" --strip-components=1
  mv "$src.tmp" "$src"
  nice -n 10 make -s -C "$src" -j"$(nproc)" criu >"$CACHE/build.log" 2>&1 ||
    { say "CRIU build failed: see $CACHE/build.log"; exit 1; }
fi
install -m 0755 "$src/criu/criu" "$DEST"
say "installed $DEST ($("$DEST" --version | sed -n 's/^Version: //p'))"

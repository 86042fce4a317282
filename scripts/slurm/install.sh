#!/usr/bin/env bash
# Install hpvc for the Slurm hosts the way a site does: a copy every user can
# run, apart from the developer's checkout (docs/slurm.md, "Site installation").
#
#   PREFIX/venv/bin/hpvc        hpvc in a virtualenv made with a Python that
#                               every user may execute (Debian's python3)
#   PREFIX/lib/hpvc_spank.so    the SPANK plugin plugstack.conf names
#   PREFIX/lib/hpvc-nodeinit    the init of container nodes (and their hpvc-rsh)
#   PREFIX/venv/share/hpvc/native  the guest's C sources (VM jobs build guests)
#
# srun/sbatch run `hpvc node check` as the submitting user, so the whole path
# to the interpreter must be searchable by everyone; the developer's .venv is
# not (its Python may live under /root, the checkout anywhere).
#
#   HPVC_SITE_PREFIX   where (default /opt/hpvc)
#   HPVC_SITE_PYTHON   the interpreter (default: the first of python3.13..3.11,
#                      python3 that an unprivileged user can run)
#
# Idempotent and quick when nothing changed: the virtualenv is rebuilt only
# when pyproject.toml or the interpreter changes, hpvc itself only when its
# sources do (pip's cache and PIP_FIND_LINKS serve the wheels). Prints the
# prefix on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
PREFIX=${HPVC_SITE_PREFIX:-/opt/hpvc}
PREFIX=${PREFIX%/}
die() { echo "slurm-install: $*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "needs root (installs into $PREFIX)"
case "$PREFIX" in /?*) ;; *) die "HPVC_SITE_PREFIX must be an absolute path" ;; esac
so=$repo/native/spank/hpvc_spank.so
[ -e "$so" ] || die "$so is not built: run 'make -C native/spank'"

# An account with no rights at all, to check what every user can run.
nobody=$(id -u nobody 2>/dev/null) || die "no user 'nobody' to check permissions with"
as_nobody() { setpriv --reuid="$nobody" --regid="$(id -g nobody)" --clear-groups -- "$@"; }

py=${HPVC_SITE_PYTHON:-}
if [ -z "$py" ]; then
  for cand in /usr/bin/python3.13 /usr/bin/python3.12 /usr/bin/python3.11 /usr/bin/python3; do
    [ -x "$cand" ] || continue
    if as_nobody "$cand" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      py=$cand
      break
    fi
  done
  [ -n "$py" ] || die "no Python 3.11+ that every user can run in /usr/bin (apt-get install python3 python3-venv)"
fi
as_nobody "$py" -c pass 2>/dev/null || die "$py cannot be run by other users: give HPVC_SITE_PYTHON"

umask 022
mkdir -p "$PREFIX"
chmod 755 "$PREFIX"
# Two test clusters may start at once: one installer at a time.
exec 9>"$PREFIX/.install.lock"
flock 9

venv=$PREFIX/venv
want_env="$("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])') $(sha256sum "$repo/pyproject.toml" | cut -c1-16)"
want_src=$(cd "$repo" && find src -type f -name '*.py' -o -type f -name py.typed | LC_ALL=C sort |
  xargs sha256sum | sha256sum | cut -c1-16)

# A copy of the sources to build from: pip (setuptools) writes build/ and
# *.egg-info next to what it builds, which must not land in the checkout.
build_copy() {
  local d
  d=$(mktemp -d)
  cp -r "$repo/src" "$repo/pyproject.toml" "$repo/README.md" "$d/"
  find "$d" -name __pycache__ -prune -exec rm -rf {} +
  echo "$d"
}

if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.hpvc-env" 2>/dev/null)" != "$want_env" ]; then
  echo "slurm-install: creating $venv with $py"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  src=$(build_copy)
  "$venv/bin/pip" install -q "$src" || { rm -rf "$src" "$venv"; die "pip install into $venv failed"; }
  rm -rf "$src"
  echo "$want_env" >"$venv/.hpvc-env"
  echo "$want_src" >"$venv/.hpvc-src"
elif [ "$(cat "$venv/.hpvc-src" 2>/dev/null)" != "$want_src" ]; then
  echo "slurm-install: updating hpvc in $venv"
  src=$(build_copy)
  "$venv/bin/pip" install -q --no-deps --force-reinstall "$src" ||
    { rm -rf "$src"; die "pip install of hpvc into $venv failed"; }
  rm -rf "$src"
  echo "$want_src" >"$venv/.hpvc-src"
fi

# The guest's C sources (hpvc-init, its agent, hpvc-rsh, the UCX ivshmem
# module): `hpvc node up` of a VM job compiles them into the guest image it
# builds (hpvc.image.guest and hpvc.image.ucx look in <venv>/share/hpvc/native
# when hpvc is not run from its checkout). Without ucx/ a job's guests had no
# module and its tasks no region: MPI between co-resident guests went over TCP.
native=$venv/share/hpvc/native
for part in guest agent ucx; do
  if ! diff -rq "$repo/native/$part" "$native/$part" >/dev/null 2>&1; then
    mkdir -p "$native"
    rm -rf "$native/$part.new"
    cp -r "$repo/native/$part" "$native/$part.new"
    find "$native/$part.new" -type f ! -name '*.[ch]' ! -name Makefile -delete
    rm -rf "$native/$part"
    mv "$native/$part.new" "$native/$part"
  fi
done

mkdir -p "$PREFIX/lib"
if ! cmp -s "$so" "$PREFIX/lib/hpvc_spank.so"; then
  install -m 0755 "$so" "$PREFIX/lib/hpvc_spank.so.new"
  mv -f "$PREFIX/lib/hpvc_spank.so.new" "$PREFIX/lib/hpvc_spank.so"
fi

# The nodes' NFS client (docs/storage.md), for jobs with [shared] server = "nfs":
# hpvc looks for it beside its virtualenv (hpvc.host.nfs_mount.client_binary).
nfs=$repo/native/nfsfuse/hpvc-nfsfuse
if [ -x "$nfs" ] && ! cmp -s "$nfs" "$PREFIX/lib/hpvc-nfsfuse"; then
  install -m 0755 "$nfs" "$PREFIX/lib/hpvc-nfsfuse.new"
  mv -f "$PREFIX/lib/hpvc-nfsfuse.new" "$PREFIX/lib/hpvc-nfsfuse"
fi

# The init of container nodes (docs/containers.md):
# hpvc looks for it beside its virtualenv (hpvc.backends.crun.nodeinit.binary).
ni=$repo/native/nodeinit/hpvc-nodeinit
[ -x "$ni" ] || die "$ni is not built: run 'make -C native/nodeinit'"
if ! cmp -s "$ni" "$PREFIX/lib/hpvc-nodeinit"; then
  install -m 0755 "$ni" "$PREFIX/lib/hpvc-nodeinit.new"
  mv -f "$PREFIX/lib/hpvc-nodeinit.new" "$PREFIX/lib/hpvc-nodeinit"
fi

as_nobody "$venv/bin/hpvc" --version >/dev/null 2>&1 ||
  die "$venv/bin/hpvc does not run as an unprivileged user: check the modes along $venv"
echo "$PREFIX"

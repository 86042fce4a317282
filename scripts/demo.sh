#!/usr/bin/env bash
# What `make demo` runs: inspect this host, plan a cluster on it, then plan and
# render the tuned example on a real 4-socket machine's topology snapshot.
set -euo pipefail
cd "$(dirname "$0")/.."
HPVC=.venv/bin/hpvc
out=build/demo
topo_src=../shared/topologies/40intel64-4n10c+pci-conflicts.tar.bz2

echo "== hpvc doctor: what this host offers"
$HPVC doctor
echo
echo "== hpvc topology: this host"
$HPVC topology
echo
echo "== hpvc plan examples/small.toml: on this host"
$HPVC plan examples/small.toml
if [ -f "$topo_src" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  tar xjf "$topo_src" -C "$tmp"
  root="$tmp/40intel64-4n10c+pci-conflicts"
  echo
  echo "== hpvc plan examples/cluster.toml: on a 4-socket, 40-CPU snapshot"
  $HPVC plan examples/cluster.toml --topology-root "$root"
  echo
  echo "== hpvc render examples/vm-cluster.toml --out $out/vm: libvirt XML, QEMU argv"
  $HPVC render examples/vm-cluster.toml --out "$out/vm" --topology-root "$root"
  echo
  echo "== hpvc render examples/cluster.toml --out $out/containers: OCI configs"
  $HPVC render examples/cluster.toml --out "$out/containers" --topology-root "$root"
fi

#!/usr/bin/env bash
# What `make demo` runs: the main job on one machine. Builds the image the
# first time, brings up a head + 2 compute container cluster, runs MPI across
# it, compares MPI ping-pong with native processes, tears everything down.
# Then plans and renders a tuned cluster on a real 4-socket machine's topology.
set -euo pipefail
cd "$(dirname "$0")/.."
HPVC=.venv/bin/hpvc
PY=.venv/bin/python
out=build/demo
mkdir -p "$out"

echo "== hpvc doctor"
$HPVC doctor | tail -n 1
echo
echo "== hpvc image build hpc   (first time ~1 min: debootstrap; then cached)"
$HPVC image build hpc
echo
$HPVC down demo >/dev/null 2>&1 || true          # a demo left by an interrupted run
trap '$HPVC down demo >/dev/null 2>&1 || true' EXIT
echo "== hpvc up examples/demo.toml"
$HPVC up examples/demo.toml
echo
echo "== hpvc run demo -- hostname   (an MPI job, one rank per compute vCPU)"
$HPVC run demo -- hostname
echo
echo "== MPI ping-pong: native processes vs two co-resident containers"
make -s -C native/bench OUT="$PWD/$out"
shared=$($HPVC status demo --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["shared_dir"]["host"])')
cp "$out/pingpong" "$shared/"
mpirun.openmpi --allow-run-as-root -n 2 --bind-to none "$out/pingpong" 4194304 1000 > "$out/native.jsonl"
$HPVC run demo -n 2 -- /shared/pingpong 4194304 1000 > "$out/demo.jsonl"
$PY - "$out/native.jsonl" "$out/demo.jsonl" <<'PYEOF'
import json, sys
def load(p):
    return {r["bytes"]: r for r in map(json.loads, open(p))}
native, virt = load(sys.argv[1]), load(sys.argv[2])
print(f"{'message':>10} {'native':>16} {'containers':>16} {'ratio':>6}")
for size, key, unit in ((4, "latency_us", "us"), (1024, "latency_us", "us"),
                        (1048576, "bandwidth_MBps", "MB/s"), (4194304, "bandwidth_MBps", "MB/s")):
    n, v = native[size][key], virt[size][key]
    ratio = n / v if key == "latency_us" else v / n
    print(f"{size:>9}B {n:>11.2f} {unit:<4} {v:>11.2f} {unit:<4} {ratio:>6.2f}")
print("ratio: containers vs native, 1.00 = as fast (single run; see hpvc bench locality)")
PYEOF
echo
echo "== hpvc down demo"
$HPVC down demo
trap - EXIT
echo "left on the host: $(crun list -q | grep -c '^hpvc-demo-' || true) containers," \
  "$(ls /run/netns 2>/dev/null | grep -c '^hpvc-demo-' || true) network namespaces"

topo_src=tests/data/topologies/40intel64-4n10c+pci-conflicts.tar.bz2
if [ -f "$topo_src" ]; then
  tmp=$(mktemp -d)
  tar xjf "$topo_src" -C "$tmp"
  root="$tmp/40intel64-4n10c+pci-conflicts"
  echo
  echo "== hpvc plan examples/cluster.toml on a 4-socket, 40-CPU machine (snapshot)"
  $HPVC plan examples/cluster.toml --topology-root "$root"
  echo
  echo "== hpvc render examples/vm-cluster.toml: libvirt XML and QEMU command lines"
  $HPVC render examples/vm-cluster.toml --out "$out/vm" --topology-root "$root"
  rm -rf "$tmp"
fi

# Slurm: a private test cluster with hpvc's SPANK plugin (three hosts apart in
# their own namespaces, each with its own hpvc state directory), one job whose
# tasks run inside the job's own virtual nodes, then everything stopped again.
echo
echo "== Slurm: srun -N2 -n2 --hpvc=examples/slurm.toml (docs/slurm.md)"
make -s -C native/spank
# hpvc and the plugin where every user can run them (/opt/hpvc), as a site has them.
bash scripts/slurm/install.sh >/dev/null
slurm_dir=$(mktemp -d /var/tmp/hpvc-demo-slurm.XXXXXX)
chmod 755 "$slurm_dir"
port=$($PY -c 'from hpvc.bench.slurm.cluster import free_base_port; print(free_base_port(7817))')
slurm_env=(HPVC_SLURM_DIR="$slurm_dir/slurm" HPVC_SLURM_PORT="$port"
  HPVC_SLURM_HOST_STATE="$slurm_dir/slurm/hpvc/%h" HPVC_SPANK_ARGS="binds=$slurm_dir")
slurm_stop() { env "${slurm_env[@]}" bash scripts/slurm/down.sh >/dev/null || true; rm -rf "$slurm_dir"; }
# Slurm job shares recorded in the hosts' state directories, all hosts together.
slurm_shares() {
  local h n=0
  for h in n1 n2 n3; do
    n=$(( n + $(HPVC_STATE_DIR="$slurm_dir/slurm/hpvc/$h" $HPVC node ls --json | grep -c '"job"' || true) ))
  done
  echo "$n"
}
trap slurm_stop EXIT
env "${slurm_env[@]}" bash scripts/slurm/up.sh | tail -n 1
cp examples/slurm.toml "$slurm_dir/"
# Submitted by an ordinary user (nobody), as on a site: not root.
(cd "$slurm_dir" && setpriv --reuid="$(id -u nobody)" --regid="$(id -g nobody)" --clear-groups \
  env -i PATH=/usr/bin:/bin SLURM_CONF="$slurm_dir/slurm/slurm.conf" srun -N2 -n2 --hpvc=slurm.toml \
  sh -c 'echo "task $SLURM_PROCID on Slurm host $SLURMD_NODENAME runs in virtual node $(hostname)"' | sort)
# The job epilog takes the virtual nodes down after srun returned: wait for it.
for _ in $(seq 100); do
  compgen -G "$slurm_dir/slurm/hpvc/*/clusters/j*" >/dev/null || break
  sleep 0.3
done
left=$(slurm_shares)
slurm_stop
trap - EXIT
echo "left on the host: $left Slurm job shares (over the state directories of hosts n1, n2, n3)"

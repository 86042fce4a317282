#!/bin/bash
# The ivshmem module's TCP fallback against UCX's own tcp, host processes, one host.
#
#   scripts/bench/ucx_fallback_loop.sh REPS [MODULE_DIR]
#
# Two Open MPI ranks (pml ucx) run native/bench/migloop for 6 s, each standing for a
# guest at its own loopback address (UCX_IVSHMEM_ADDR=127.0.0.2, .3). "fallback":
# UCX_TLS=ivshmem,self, and at 2.5 s hpvc.host.region_departure.depart takes .3 off
# the region, so the pair goes on over the module's TCP; "tcp": UCX_TLS=tcp,self from
# the start. Both alternate in each repetition; each prints round trips per second
# over seconds 4-6 of the loop. MODULE_DIR holds libuct_ivshmem.so (default: built
# here from native/ucx). Needs mpicc.openmpi and the project's .venv.
set -euo pipefail
reps=${1:?usage: $0 REPS [MODULE_DIR]}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/hpvc-fbloop-XXXXXX)
region=/dev/shm/hpvc-fbloop-$$
trap 'rm -rf "$work" "$region"' EXIT
mod=${2:-$work}
[ -n "${2:-}" ] || make -s -C "$root/native/ucx" OUT="$work"
mpicc.openmpi -O2 -o "$work/migloop" "$root/native/bench/migloop.c"
printf '#!/bin/sh\nr=${OMPI_COMM_WORLD_RANK:-0}\nexport UCX_IVSHMEM_ADDR=127.0.0.$((2 + r))\nexec "$@"\n' > "$work/as-guest"
chmod +x "$work/as-guest"

one() { # $1 tls, $2 depart (1/0): round trips/s over seconds 4-6
	rm -f "$region"; truncate -s 64M "$region"
	UCX_IVSHMEM_PATH=$region UCX_TLS=$1 UCX_LOG_LEVEL=warn UCX_WARN_UNUSED_ENV_VARS=n \
	LD_PRELOAD=$mod/libuct_ivshmem.so setsid timeout 60 mpirun.openmpi --allow-run-as-root \
		--oversubscribe -np 2 --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any \
		--mca btl self -x LD_PRELOAD -x UCX_IVSHMEM_PATH -x UCX_TLS -x UCX_LOG_LEVEL \
		"$work/as-guest" "$work/migloop" 6 > "$work/out" 2>&1 &
	local job=$!
	sleep 2.5
	if [ "$2" = 1 ]; then
		(cd "$root" && .venv/bin/python -c "
from pathlib import Path
from hpvc.host import region_departure as r
r.depart(Path('$region'), '127.0.0.3', timeout_s=10)")
	fi
	wait $job
	awk '/loop at 4 s:/{a=$5} /loop at 6 s:/{b=$5} END{if(!a||!b) exit 1; printf "%d", (b-a)/2}' \
		"$work/out" || { cat "$work/out" >&2; exit 1; }
}

echo "rep fallback tcp ratio"
for i in $(seq "$reps"); do
	if [ $((i % 2)) = 1 ]; then f=$(one ivshmem,self 1); t=$(one tcp,self 0)
	else t=$(one tcp,self 0); f=$(one ivshmem,self 1); fi
	echo "$i $f $t $(awk -v f="$f" -v t="$t" 'BEGIN{printf "%.2f", f/t}')"
done

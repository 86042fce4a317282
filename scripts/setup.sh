#!/usr/bin/env bash
# Install what hpvc needs on a Debian bookworm host: Debian packages and a
# virtualenv in .venv. Idempotent, and fast when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the project uses (tests and runtime). Keep sorted.
APT_PACKAGES=(
  acl              # setfacl: a VM node's disk reopenable by its QEMU's uid while it migrates
  busybox-static   # tests' non-Debian images (hpvc image import): a busybox-only rootfs
  cpio             # packs the VM guests' initramfs
  criu             # bookworm's CRIU 3.17 (cannot run on kernels 6.13+); setup-criu.sh adds 4.2
  crun             # OCI runtime for container nodes
  debootstrap      # builds the Debian image rootfs
  dpkg-dev         # dpkg-source: unpacks UCX's Debian source for native/ucx (apt-get source)
  e2fsprogs        # mkfs.ext4: VM disk images, the I/O tests' loop file systems
  fio              # block-I/O throttle measurements
  hpcc             # HPC Challenge (native side of the benchmarks)
  libopenblas0-pthread  # OpenBLAS: bench hpcc runs HPL with it on every side (LD_LIBRARY_PATH)
  hwloc            # hwloc-calc: reference counts for the topology tests
  fuse3            # fusermount3: the nodes' NFS client (native/nfsfuse) mounts through FUSE
  libfuse3-dev     # builds native/nfsfuse (this host kernel has no NFS client; HOST-NOTES)
  libnfs-dev       # the NFS protocol client native/nfsfuse speaks to NFS-Ganesha
  nfs-ganesha      # the cluster's NFS server (docs/storage.md): user space, runs in the server node
  nfs-ganesha-vfs  # Ganesha's back end for a directory on the host
  openjdk-17-jdk-headless  # Spark's JRE (native runs) and javac for the TeraSort application
  iperf3           # TCP bandwidth of `hpvc bench network` (cluster network vs fabric)
  iproute2         # ip, bridge: inspected by tests
  iputils-ping     # ping: tests check reachability and the MTU (-M do) across hosts
  libopenmpi-dev   # mpicc: builds the MPI micro-benchmarks in native/bench
  libucx-dev       # libuct/libucs to link native/ucx's transport module against
  libmpich-dev     # mpicc.mpich: programs for MPICH images (tests, bench locality --mpi mpich)
  openmpi-bin      # mpirun: launches MPI jobs over virtual nodes
  openssh-client   # ssh into VM guests (keys made per cluster)
  podman           # the peer of `hpvc bench startup` (Podman containers started beside hpvc's)
  qemu-system-x86  # VM nodes (KVM where usable, TCG otherwise)
  runc             # Podman's runtime with CRIU: the peer of `hpvc bench checkpoint` (crun 1.8 has none)
  qemu-utils       # qemu-img: per-node VM disks
  libvirt-clients  # virt-xml-validate: rendered domain XML checked against libvirt's schema
  libvirt-daemon   # libvirtd and virtlogd: the libvirt backend for VM nodes (docs/libvirt.md)
  libvirt-daemon-driver-qemu  # libvirtd's QEMU driver
  libvirt-dev      # headers and API description: libvirt-python builds from source against them
  pkg-config       # how libvirt-python's build finds libvirt-dev
  python3-dev      # Python.h: libvirt-python is a C extension
  libxml2-utils    # xmllint, needed by virt-xml-validate
  nftables         # nft: only a cluster's own hosts may send into its VXLAN network (docs/network.md)
  munge            # munged: the local Slurm test cluster runs its own (scripts/slurm, docs/slurm.md)
  skopeo           # hpvc image import: copies docker/OCI archives, OCI layouts, Podman images into the store
  slurm-client     # srun, sbatch, sinfo, scancel: submit to the local Slurm test cluster
  slurm-wlm        # slurmctld and slurmd: the local Slurm test cluster (make slurm-up)
  sockperf         # TCP ping-pong latency of `hpvc bench network`
  libslurm-dev     # slurm/spank.h: builds the SPANK plugin in native/spank
  stress-ng        # the competing commodity load of `hpvc bench isolation`
  umoci            # hpvc image import: unpacks OCI images (whiteouts, hard links, xattrs, paths kept inside)
  ucx-utils        # ucx_info, ucx_perftest: native/ucx's transport listed and measured (tests)
  python3-venv
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "hpvc setup: missing Debian packages: ${missing[*]} (run 'sudo make setup')" >&2
    exit 2
  fi
  echo "hpvc setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# CRIU 4.2+ for container checkpoints, from Debian testing's source (the script says why).
bash scripts/setup-criu.sh

# Python 3.11 or newer for the virtualenv.
PY=""
for cand in python3.13 python3.12 python3.11 python3; do
  if command -v "$cand" >/dev/null 2>&1 &&
     "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
    PY=$("$cand" -c "import sys; print(sys.executable)"); break
  fi
done
if [ -z "$PY" ]; then
  echo "hpvc setup: Python 3.11 or newer not found (install python3 from Debian bookworm)" >&2
  exit 2
fi

stamp=.venv/.hpvc-stamp
want="$("$PY" -c 'import sys; print(sys.version)' | head -1) $(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "hpvc setup: creating .venv with $PY"
  rm -rf .venv
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev]'
  echo "$want" > "$stamp"
fi

# libuct_ivshmem.so (native/ucx, docs/vms.md "MPI over the shared region (UCX)") is built
# against the source of the installed UCX: `apt-get source` (a deb-src entry added for
# it) into a cache that stays on the machine and never enters the repository.
UCX_CACHE=/var/cache/hpvc/ucx-src
ucx_version=$(dpkg-query -W -f='${source:Upstream-Version}' libucx0)
if [ ! -f "$UCX_CACHE/ucx-$ucx_version/src/uct/sm/mm/base/mm_iface.h" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "hpvc setup: UCX's source is not in $UCX_CACHE (run 'sudo make setup')" >&2
    exit 2
  fi
  src_list=/etc/apt/sources.list.d/hpvc-deb-src.sources
  if [ ! -f "$src_list" ]; then
    printf '%s\n' "# hpvc scripts/setup.sh: Debian source packages (UCX's, for native/ucx)" \
      'Types: deb-src' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm' \
      'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' > "$src_list"
    apt-get update -qq
  fi
  mkdir -p "$UCX_CACHE"
  (cd "$UCX_CACHE" && apt-get source -qq --download-only "ucx=$(dpkg-query -W -f='${Version}' libucx0)" &&
    rm -rf "ucx-$ucx_version" && dpkg-source -q -x ucx_*.dsc "ucx-$ucx_version") >/dev/null 2>&1 || {
    echo "hpvc setup: could not fetch UCX $ucx_version's source (apt-get source ucx)" >&2
    exit 1
  }
fi
nice make -s -C native/ucx UCX_CACHE="$UCX_CACHE"

# hpvc-nfsfuse: the nodes' NFS client (docs/storage.md); rebuilt when its source changes.
make -s -C native/nfsfuse
# hpvc-nodeinit: the init of container nodes sharing a PID namespace (docs/containers.md).
make -s -C native/nodeinit

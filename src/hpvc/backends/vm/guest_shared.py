"""The shared directory of VM nodes over NFS (spec ``[shared] server = "nfs"``).

A guest exports no host folder (virtiofs serves only a Slurm site's binds,
with the job's user's rights: ``vm.binds``), so the data lives in a
raw ext4 image on the host (``hpvc.host.nfs_backing.disk_image``: in the
cluster's folder, or ``<state>/shared/<cluster>.img`` with ``keep = true``,
the same file a kept container cluster of that name uses), never mounted on
the host, then or later: ``disk_image`` marks it written by a guest, and the
host kernel mounts no such image (a container cluster of that name is refused:
``nfs_backing.check_host_may_mount``). The node that serves it
(``SharedPlan.node``) alone gets it as its second virtio disk, serial
``hpvc-shared`` (both renderers add it from the plan). Every guest of such a
cluster boots the NFS initramfs, which loads the kernel's NFS client
(``guest_kernel.NFS_MODULES``). After the guests boot, one ssh per guest, all
at once:

- the server guest mounts that disk on ``/srv/hpvc-shared``, writes Ganesha's
  configuration (``nfs_server.render_config``, the containers' own: NFSv3 on
  TCP, MOUNT on 20048, exported to the cluster subnet only), starts rpcbind
  and ``ganesha.nfsd`` and waits until NFS and MOUNT listen;
- every guest, the server's own too, mounts ``SERVER:/shared`` at the spec's
  path with its kernel's client, retrying until the server answers:
  ``mount -i -t nfs -o vers=3,proto=tcp,port=2049,mountport=20048,
  mountproto=tcp,nolock,hard,addr=SERVER``. ``-i`` skips mount.nfs: the kernel
  parses these options itself and asks no portmapper (fixed ports) and no
  statd (``nolock``), so the clients need nothing beyond util-linux. A hard
  mount: a restarted server's clients carry on (NFSv3 keeps no state).

``status`` reads each running guest's mount over ssh (``stat -f`` under a
short timeout). ``down`` stops the guests (the mounts go with them), then the
cluster's journal removes the image unless ``keep``.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpvc.backends import shared
from hpvc.backends.base import ClusterEnv
from hpvc.backends.vm import guest as g
from hpvc.errors import HpvcError, InputError
from hpvc.host import nfs_backing, nfs_server
from hpvc.image import resolve_image
from hpvc.image.extras import preset_extras, with_extras
from hpvc.image.guest import GuestArtifacts
from hpvc.image.model import DEFAULT_PACKAGES, NFS_SERVER_PACKAGES, Image
from hpvc.image.rootfs import in_root
from hpvc.plan import Plan
from hpvc.plan.services import VM_SHARED_MIB, SharedPlan
from hpvc.progress import Progress
from hpvc.render.context import SHARED_DISK_SERIAL, RenderContext
from hpvc.spec import Spec

EXPORT_DIR = Path("/srv/hpvc-shared")  # the backing disk's mount point in the server guest
FOLDER = Path("/run/hpvc-nfs")  # Ganesha's config, log, pid file, recovery in the guest
SERVER_WAIT_S = 60  # Ganesha's start under TCG on a busy host
MOUNT_WAIT_S = 90  # a client's retries while its server starts
HEALTH_S = 5  # a status check of one mount (stat -f)
SSH_WAIT_S = 30.0  # one status ssh, handshake included


def nfs_of(plan: Plan) -> SharedPlan | None:
    """The plan's shared directory when it is served over NFS, else None."""
    sh = plan.shared
    return sh if sh is not None and sh.server == "nfs" else None


# What the guests run for an NFS shared directory, looked for in an imported
# image's own root (a built one says it by its packages): the scripts go over ssh.
NFS_IN_IMAGE = (g.SSHD, "/usr/bin/ganesha.nfsd", "/usr/sbin/rpcbind")


def preflight(spec: Spec) -> None:
    """A VM image without the NFS server is refused before any change (exit 2)."""
    if spec.shared.server != "nfs":
        return
    image = resolve_image(spec.image)
    if image.imported:
        absent = [p for p in NFS_IN_IMAGE if in_root(image.rootfs, p) is None]
        if absent:
            raise InputError(
                f"image {spec.image!r}",
                f'has no {", ".join(absent)}, which shared.server = "nfs" needs in a VM'
                " cluster (hpvc sets it up over ssh)",
                "import an image with openssh-server, nfs-ganesha-vfs and rpcbind, or leave"
                " out shared.server",
            )
        return
    missing = [p for p in NFS_SERVER_PACKAGES if p not in image.packages]
    if missing:
        raise InputError(
            f"image {spec.image!r}",
            f'has no NFS server ({", ".join(missing)}), which shared.server = "nfs"'
            " needs in a VM cluster",
            rebuild_with_nfs(image),
        )


def rebuild_with_nfs(image: Image) -> str:
    """The ``hpvc image build`` that makes ``image`` again, its own packages and
    extras kept, with the NFS server (a preset's recipe has it by itself)."""
    preset = preset_extras(image.name)
    if preset and set(NFS_SERVER_PACKAGES) <= set(with_extras(None, preset) or ()):
        return f"hpvc image build {image.name}: its recipe has them now"
    own = set(image.packages)
    defaults = set(DEFAULT_PACKAGES) <= own
    packages = (own - set(DEFAULT_PACKAGES) if defaults else own) | set(NFS_SERVER_PACKAGES)
    argv = ["hpvc", "image", "build", image.name, "--packages", ",".join(sorted(packages))]
    argv += [] if defaults else ["--no-defaults"]
    argv += ["--extras", ",".join(image.extras)] if image.extras else []
    return shlex.join(argv)


def image_path(env: ClusterEnv, sh: SharedPlan) -> Path:
    """The backing image: where a container cluster keeps its loop file system's."""
    return nfs_backing.image_of(shared.export_dir(env, sh))


def prepare(env: ClusterEnv, plan: Plan) -> None:
    """The backing image (made, or the kept one found), journaled with the cluster;
    only where the server node runs (a Slurm job's other hosts' shares mount it)."""
    sh = nfs_of(plan)
    if sh is None or sh.node not in {n.name for n in plan.nodes}:
        return
    if sh.keep:
        shared.kept_dir(env).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    size = sh.size_mib or VM_SHARED_MIB
    nfs_backing.disk_image(env.journal(), image=image_path(env, sh), size_mib=size, keep=sh.keep)


def context(
    env: ClusterEnv, plan: Plan, guest: GuestArtifacts, ctx: RenderContext
) -> RenderContext:
    """``ctx`` with the NFS initramfs and the backing image, for an NFS cluster."""
    sh = nfs_of(plan)
    if sh is None:
        return ctx
    if guest.initrd_nfs is None:
        raise HpvcError("VM guest artifacts", "have no NFS initramfs (initrd-nfs.img)")
    return replace(ctx, initrd=str(guest.initrd_nfs), shared_image=str(image_path(env, sh)))


# --- the scripts each guest runs (sh, fed on stdin) ------------------------------------


def mount_options(address: str) -> str:
    """The kernel NFS client's own options: no portmapper, no statd, no helper."""
    return (
        f"vers=3,proto=tcp,port={nfs_server.NFS_PORT},mountport={nfs_server.MOUNT_PORT}"
        f",mountproto=tcp,nolock,hard,addr={address}"
    )


def server_script(plan: Plan, sh: SharedPlan, *, root_squash: bool) -> str:
    """Mount the backing disk, configure and start rpcbind and Ganesha, wait for them."""
    assert sh.address is not None
    conf = nfs_server.render_config(
        export_dir=EXPORT_DIR, folder=FOLDER, subnet=plan.network.subnet,
        address=sh.address, root_squash=root_squash, pseudo=sh.export,
    )  # fmt: skip
    q = shlex.quote
    log, pid = q(str(FOLDER / nfs_server.LOG)), q(str(FOLDER / nfs_server.PIDFILE))
    tries = SERVER_WAIT_S * 10
    nfs_port, mount_port = f"{nfs_server.NFS_PORT:04X}", f"{nfs_server.MOUNT_PORT:04X}"
    return f"""\
set -eu
dev=
for d in /sys/block/vd*; do
    [ "$(cat "$d/serial" 2>/dev/null)" = {SHARED_DISK_SERIAL} ] && dev=/dev/${{d##*/}}
done
[ -n "$dev" ] || {{ echo "no disk with serial {SHARED_DISK_SERIAL}" >&2; exit 1; }}
mkdir -p {q(str(EXPORT_DIR))} {q(str(FOLDER / "recovery"))} {q(str(FOLDER / "run"))}
mountpoint -q {q(str(EXPORT_DIR))} || mount -t ext4 -o noatime "$dev" {q(str(EXPORT_DIR))}
[ -e /etc/mtab ] || ln -s ../proc/self/mounts /etc/mtab  # Ganesha finds file systems there
cat > {q(str(FOLDER / nfs_server.CONF))} <<'HPVC_EOF'
{conf}HPVC_EOF
[ -S /run/rpcbind.sock ] || rpcbind </dev/null >/dev/null 2>&1  # it goes to the background
listening() {{ grep -q ":$1 00000000:0000 0A" /proc/net/tcp; }}
# Ganesha's serious messages, but for those of D-Bus and Kerberos (off on purpose).
serious() {{  # one process: each costs ~0.2 s under TCG
    awk -v ORS=' ' 'tolower($0) !~ /dbus|keytab|krb5|gssd/ && / :(FATAL|CRIT|MAJ) :/ {{
        sub(/^.* :(FATAL|CRIT|MAJ) :/, ""); print; if (++n == 2) exit }}' {log} 2>/dev/null
}}
fail() {{ echo "NFS-Ganesha: $1: $(serious)" >&2; exit 1; }}
if ! listening {nfs_port}; then
    rm -f {log} {pid}
    DBUS_SYSTEM_BUS_ADDRESS=unix:path={q(str(FOLDER / "no-dbus"))} setsid -f ganesha.nfsd -F \\
        -f {q(str(FOLDER / nfs_server.CONF))} -L {log} -p {pid} </dev/null >/dev/null 2>&1
fi
i=0
until listening {nfs_port} && listening {mount_port}; do
    i=$((i + 1))
    [ "$i" -lt {tries} ] || fail "not listening after {SERVER_WAIT_S} s"
    [ ! -s {pid} ] || {{ read -r p <{pid} && kill -0 "$p" 2>/dev/null; }} || fail "exited"
    sleep 0.1
done
[ -z "$(serious)" ] || fail "started with errors"
"""


def mount_script(sh: SharedPlan) -> str:
    """Mount the export at the spec's path, retrying while the server starts."""
    assert sh.address is not None
    q = shlex.quote
    source, path = f"{sh.address}:{sh.export}", sh.path
    return f"""\
set -eu
mkdir -p {q(path)}
if ! grep -q {q(f" {path} nfs ")} /proc/mounts; then
    i=0
    until out=$(mount -i -t nfs -o {mount_options(sh.address)} {q(source)} {q(path)} 2>&1); do
        i=$((i + 1))
        [ "$i" -lt {MOUNT_WAIT_S * 5} ] || {{ echo "mount {source} on {path}: $out" >&2; exit 1; }}
        sleep 0.2
    done
fi
"""


def health_script(sh: SharedPlan, *, server: bool) -> str:
    """The mount's state on the first line: ``ok`` (``stat -f`` answered through it)
    or what is wrong; the server adds ``backing BSIZE BLOCKS BFREE`` of its disk."""
    q = shlex.quote
    source, path = f"{sh.address}:{sh.export}", sh.path
    backing = f"stat -f -c 'backing %S %b %f' {q(str(EXPORT_DIR))} 2>/dev/null || true"
    return f"""\
m=$(grep {q(f" {path} ")} /proc/mounts | tail -n 1)
case "$m" in
    {q(f"{source} {path} nfs ")}*)
        if timeout -s KILL {HEALTH_S} stat -f {q(path)} >/dev/null 2>&1; then echo ok
        else echo "not answering (no reply in {HEALTH_S} s)"; fi ;;
    "") echo "not mounted" ;;
    *) echo "mounted from ${{m%% *}}, not {source}" ;;
esac
{backing if server else ""}
"""


# --- running them ----------------------------------------------------------------------


Done = tuple[int | None, str, str]  # returncode (None: no answer in time), stdout, stderr


def _ssh_all(
    env: ClusterEnv, plan: Plan, scripts: dict[str, str], wait_s: float
) -> dict[str, Done]:
    """Run each node's script in its guest (``sh -s``), all at once."""
    procs = {
        name: subprocess.Popen(
            g.ssh_argv(env.dir, plan.node(name).ip, ["sh", "-s"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in scripts
    }
    out: dict[str, Done] = {}
    deadline = time.monotonic() + wait_s
    for name, proc in procs.items():
        try:
            so, se = proc.communicate(scripts[name], timeout=max(1.0, deadline - time.monotonic()))
            out[name] = (proc.returncode, so, se)
        except subprocess.TimeoutExpired:
            proc.kill()  # our own ssh, by its PID
            proc.communicate()
            out[name] = (None, "", f"no answer over ssh in {wait_s:g} s")
    return out


def start(env: ClusterEnv, plan: Plan, names: list[str], progress: Progress) -> float | None:
    """Serve (when the server node is among ``names``) and mount in ``names``;
    seconds taken, or None for a cluster without NFS."""
    sh = nfs_of(plan)
    if sh is None or not names:
        return None
    t0 = time.perf_counter()
    scripts = {name: mount_script(sh) for name in names}
    if sh.node in scripts:
        progress(f"shared directory: NFS server in {sh.node}, mounts at {sh.path}")
        serve = server_script(plan, sh, root_squash=env.rec.tenant)
        scripts[sh.node] = serve + scripts[sh.node]
    else:
        progress(f"shared directory: mounting {sh.address}:{sh.export} at {sh.path}")
    done: dict[str, Done] = {}
    for attempt in range(3):  # the scripts may run again: each step is skipped once done
        done.update(_ssh_all(env, plan, scripts, SERVER_WAIT_S + MOUNT_WAIT_S + 30.0))
        scripts = {n: scripts[n] for n, r in done.items() if r[0] == 255}  # ssh itself failed
        if not scripts or attempt == 2:
            break
        time.sleep(1.0)
    failed = sorted((n != sh.node, n) for n, r in done.items() if r[0] != 0)
    if failed:  # the server's failure first: it explains its clients'
        name = failed[0][1]
        err = done[name][2].strip()
        why = err.splitlines()[-1] if err else "ssh failed"
        if sh.node not in names:  # on another host of a Slurm job
            why += f" (the server: {sh.node} at {sh.address}, on another host)"
        raise HpvcError(f"shared directory in {name}", why)
    return time.perf_counter() - t0


def status(env: ClusterEnv, plan: Plan, running: list[str]) -> dict[str, Any] | None:
    """The ``shared_dir`` of ``hpvc status`` (the containers' shape), read over ssh
    from the guests in ``running``; None for a cluster without NFS."""
    sh = nfs_of(plan)
    if sh is None:
        return None
    out: dict[str, Any] = {
        "server": sh.server,
        "path": sh.path,
        "keep": sh.keep,
        "node": sh.node,
        "export": f"{sh.address}:{sh.export}",
        "backing": str(image_path(env, sh)),
        "size_mib": sh.size_mib,
    }
    scripts = {n: health_script(sh, server=n == sh.node) for n in running}
    done = _ssh_all(env, plan, scripts, SSH_WAIT_S)
    mounts: dict[str, str] = {}
    for n in plan.nodes:
        code, so, se = done.get(n.name, (0, "not running", ""))
        lines = so.strip().splitlines() or se.strip().splitlines() or [f"ssh failed ({code})"]
        mounts[n.name] = lines[0]
        words = lines[-1].split()
        if len(words) == 4 and words[0] == "backing" and all(w.isdigit() for w in words[1:]):
            bsize, blocks, free = (int(w) for w in words[1:])  # as containers': statvfs
            out.update(size_bytes=blocks * bsize, used_bytes=(blocks - free) * bsize)
    out["mounts"] = mounts
    return out

"""A private copy of the local Slurm test cluster, for the Slurm benchmarks and tests.

scripts/slurm/up.sh in a temporary directory, on a fabric no one else uses:
three hosts (up to 32: ``hosts``) apart in their own namespaces, the SPANK
plugin of native/spank in its plugstack, each host's hpvc state in the same
temporary directory, images shared; scripts/slurm/down.sh on the way out.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hpvc.bench import common
from hpvc.errors import HpvcError, InputError
from hpvc.progress import Progress, quiet
from hpvc.slurm.policy import parse_share_name
from hpvc.store import Store

TIMEOUT_S = 120


def repo_dir() -> Path:
    return common.native_dir().parent.parent


HOSTS = ("n1", "n2", "n3")


def fabric_of(port: int) -> tuple[str, str]:
    """The fabric bridge and subnet scripts/slurm/common.sh derives from a
    cluster's base port: 6917 -> hpvcfab0, 10.250.0.0/24; 6918 -> hpvcfab1 ..."""
    n = (port - 6917) % 256
    return f"hpvcfab{n}", f"10.250.{n}.0/24"


def free_base_port(start: int = 7917) -> int:
    """A base port for a private test cluster whose fabric (bridge, network
    namespaces, subnet; ``fabric_of``) no one on this machine uses: the
    daemons listen inside their own network namespaces, so only the fabric
    can collide (a `make slurm-up` cluster holds 6917's)."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    addrs = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True)
    if links.returncode != 0 or addrs.returncode != 0:
        raise HpvcError("bench slurm", "cannot list network interfaces", "is `ip` installed?")
    names = {line.split(": ")[1].split("@")[0] for line in links.stdout.splitlines()}
    netns_dir = Path("/run/netns")
    netns = [p.name for p in netns_dir.iterdir()] if netns_dir.is_dir() else []
    words = addrs.stdout.split()
    for base in range(start, start + 256):
        bridge, subnet = fabric_of(base)
        prefix = subnet.removesuffix("0/24")
        if (
            bridge not in names
            and not any(n.startswith(f"{bridge}-") for n in netns)
            and not any(w.startswith(prefix) for w in words)
        ):
            return base
    raise HpvcError("bench slurm", f"no free test cluster fabric for ports {start}-{start + 255}")


@dataclass(frozen=True)
class Submitter:
    """An ordinary user who submits jobs: Slurm runs their tasks with their ids,
    and hpvc must hold their job to what Slurm gave it."""

    name: str
    uid: int
    gid: int

    @classmethod
    def named(cls, name: str) -> Submitter:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise InputError(
                f"user {name!r}", "no such user on this machine", "give an existing user"
            ) from None
        if pw.pw_uid == 0:
            raise InputError(
                f"user {name!r}", "is root", "submit as an ordinary user, as a site's users do"
            )
        return cls(name, pw.pw_uid, pw.pw_gid)


@dataclass(frozen=True)
class SlurmCluster:
    """A private Slurm test cluster: its directory, the environment to submit
    to it, and a way into each of its hosts (namespaces, hpvc state)."""

    dir: Path  # HPVC_SLURM_DIR
    env: dict[str, str]  # SLURM_CONF and the HPVC_SLURM_* of the cluster
    hosts: tuple[str, ...] = HOSTS  # n1..nN (HPVC_SLURM_HOSTS)

    def store(self, host: str) -> Store:
        """hpvc's state on ``host`` (the plugin's state_dir, %h = host)."""
        return Store(self.dir / "hpvc" / host)

    def shares(self) -> list[tuple[str, str]]:
        """(host, share) of every Slurm job share on any host, half-made ones too."""
        out = []
        for h in self.hosts:
            base = self.store(h).root / "clusters"
            names = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
            out += [(h, n) for n in names if parse_share_name(n)]
        return out

    def on(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run on ``host``: in its network, UTS and mount namespaces,
        with its HPVC_STATE_DIR (scripts/slurm/on.sh)."""
        return ["bash", str(repo_dir() / "scripts" / "slurm" / "on.sh"), host, *argv]

    def run_on(self, host: str, argv: list[str], timeout: float = 60) -> str:
        r = subprocess.run(
            self.on(host, argv),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if r.returncode != 0:
            why = (r.stderr or r.stdout).strip()[-300:]
            raise HpvcError(f"on {host}: {' '.join(argv)}", why or f"exit code {r.returncode}")
        return r.stdout

    def user_env(self, user: Submitter) -> dict[str, str]:
        """What a user's login shell would give srun: nothing of root's."""
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/",
            "USER": user.name,
            "LOGNAME": user.name,
            "LANG": "C.UTF-8",
            "SLURM_CONF": self.env["SLURM_CONF"],
            **self.resident_env(),
        }

    def resident_env(self) -> dict[str, str]:
        """Where the submitting side's resident hpvc listens (up.sh starts one
        unless HPVC_SLURM_RESIDENT=0): srun's `hpvc node check` goes there."""
        sock = self.dir / "run" / "hpvc-login.sock"
        return {"HPVC_RESIDENT_SOCKET": str(sock)} if sock.exists() else {}

    def submit(
        self,
        user: Submitter,
        argv: list[str],
        cwd: Path,
        timeout: float = TIMEOUT_S,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` (srun, sbatch, salloc, squeue, scancel ...) run as ``user``:
        their ids, no supplementary groups, their environment (plus ``env``)."""
        return subprocess.run(
            argv,
            env={**self.user_env(user), **(env or {})},
            cwd=cwd,
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def sweep(self, hpvc_bin: str) -> list[tuple[str, str]]:
        """Take every share left on any host down inside its host; return them."""
        left = self.shares()
        for host, job in sorted({(h, p[0]) for h, n in left if (p := parse_share_name(n))}):
            self.run_on(host, [hpvc_bin, "node", "down", "--job", str(job)], timeout=TIMEOUT_S)
        return left


def site_install() -> Path:
    """hpvc and the SPANK plugin installed where every user can run them
    (scripts/slurm/install.sh, HPVC_SITE_PREFIX or /opt/hpvc), up to date with
    this checkout; returns the prefix."""
    r = subprocess.run(
        ["bash", str(repo_dir() / "scripts" / "slurm" / "install.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if r.returncode != 0:
        raise HpvcError("scripts/slurm/install.sh", (r.stderr or r.stdout).strip()[-300:])
    return Path(r.stdout.strip().splitlines()[-1])


@contextmanager
def private_slurm(
    tmp: Path,
    subnets: str,
    progress: Progress = quiet,
    extra_args: str = "",
    resident: bool = True,
    hosts: int = len(HOSTS),
) -> Iterator[SlurmCluster]:
    """A local Slurm test cluster with the hpvc plugin under ``tmp``/slurm: three
    hosts apart (namespaces, hpvc state each), jobs allowed ``subnets``, a
    resident hpvc on each host and the submitting side unless not
    ``resident``. On the way out scripts/slurm/down.sh takes shares a job
    left down inside their hosts, stops the cluster and removes its fabric
    and directory."""
    repo = repo_dir()
    progress("building the SPANK plugin")
    b = subprocess.run(
        ["make", "-s", "-C", str(repo / "native" / "spank")],
        capture_output=True,
        text=True,
        check=False,
    )
    if b.returncode != 0:
        raise HpvcError("build native/spank", (b.stderr or b.stdout).strip()[-300:])
    progress("installing hpvc and the plugin for every user (scripts/slurm/install.sh)")
    prefix = site_install()
    from hpvc.image import default_store

    slurm_dir = tmp / "slurm"
    env = dict(
        os.environ,
        HPVC_SLURM_DIR=str(slurm_dir),
        HPVC_SLURM_PORT=str(free_base_port()),
        HPVC_SLURM_HOST_STATE=str(slurm_dir / "hpvc" / "%h"),
        HPVC_IMAGE_DIR=str(default_store()),  # shared by the hosts, like a cluster file system
        HPVC_SPANK_SO=str(prefix / "lib" / "hpvc_spank.so"),
        HPVC_BIN=str(prefix / "venv" / "bin" / "hpvc"),
        HPVC_SPANK_ARGS=f"subnets={subnets} {extra_args}".strip(),
        HPVC_SLURM_RESIDENT="1" if resident else "0",
        HPVC_SLURM_HOSTS=str(hosts),
    )
    scripts = repo / "scripts" / "slurm"
    progress(f"starting a private Slurm cluster ({hosts} hosts)")
    cluster = SlurmCluster(slurm_dir, env, tuple(f"n{i}" for i in range(1, hosts + 1)))
    # Each host starts Python twice (node prepare, its resident hpvc): allow for it.
    limit = 90 + 3 * hosts
    try:
        r = subprocess.run(
            ["bash", str(scripts / "up.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=limit,
            check=False,
        )
        if r.returncode != 0:
            raise HpvcError("bench slurm: up.sh", (r.stderr or r.stdout).strip()[-300:])
        env["SLURM_CONF"] = str(slurm_dir / "slurm.conf")
        yield cluster
    finally:
        # down.sh takes shares a job left down inside their hosts first.
        progress("stopping the private Slurm cluster")
        subprocess.run(
            ["bash", str(scripts / "down.sh")],
            env=env,
            capture_output=True,
            timeout=limit,
            check=False,
        )

"""The libvirt backend on the real host, against a private libvirtd started for these tests.

``PrivateLibvirtd`` runs virtlogd and libvirtd in their own mount namespace
(``unshare --mount``), with a tmp directory bind-mounted over each directory a
system libvirtd uses (/etc/libvirt, /run/libvirt, /var/lib/libvirt,
/var/cache/libvirt, /var/log/libvirt), so its configuration (qemu.conf with
``user = "root"``), domain definitions, pid files and logs are its own and
cannot meet another libvirtd on the host. Its socket lies in the tmp directory,
outside the namespace's bind mounts: the tests reach it with
``qemu:///system?socket=<tmp>/sock/libvirt-sock``. Only the QEMU driver is
loaded (``LIBVIRT_DRIVER_DIR``), and cgroups are left alone
(``cgroup_controllers = []``): libvirt pins with sched_setaffinity. Both
daemons are stopped by PID at the end, every domain removed first.

Guests boot under TCG from the ``hpc`` image (built once, cached), on a bridge
the test makes (10.219.<pid>.0/24); traffic goes only to the guest's address
on it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hpvc.backends.libvirt import domain as vm_libvirt
from hpvc.backends.vm import console
from hpvc.backends.vm.guest import ssh_argv, ssh_key
from hpvc.cluster import lifecycle, ops
from hpvc.errors import DoesNotFit, HpvcError, InputError, MissingDependency
from hpvc.host import net, procfs, qemu_access, qemu_user
from hpvc.host.journal import Journal
from hpvc.image import resolve_image
from hpvc.image.guest import GuestArtifacts, build_guest, kernel_cmdline, node_disk
from hpvc.plan import Plan, PlannedNode, plan_cluster
from hpvc.render.context import RenderContext, tap_name
from hpvc.render.libvirt import domain_name, domain_uuid, render_domain_xml
from hpvc.spec.model import Spec
from hpvc.store import Store
from hpvc.topology import read_topology
from tests.helpers import requires
from tests.integration.test_cluster import image_ready
from tests.integration.test_vm_cluster import (
    assert_agent_key_reached_the_guests,
    assert_confined,
    vm_leftovers,
    vm_spec,
)

pytestmark = pytest.mark.integration

PID = os.getpid()
SUBNET = f"10.219.{PID % 250}"
READY_TIMEOUT_S = 180.0
_LABELS = iter("abcdefghijklmnopqrstuvwxyz")  # one cluster name per test
DAEMON_START_S = 60.0
PRIVATE_DIRS = {  # tmp subdirectory -> what it replaces inside the namespace
    "etc": "/etc/libvirt",
    "run": "/run/libvirt",
    "lib": "/var/lib/libvirt",
    "cache": "/var/cache/libvirt",
    "log": "/var/log/libvirt",
}
QEMU_USER = "libvirt-qemu"  # libvirtd resolves its built-in default user before reading qemu.conf
START_SCRIPT = r"""
root=$1
for pair in etc:/etc/libvirt run:/run/libvirt lib:/var/lib/libvirt \
            cache:/var/cache/libvirt log:/var/log/libvirt; do
  mount --bind "$root/${pair%%:*}" "${pair#*:}"
done
mount --bind "$root/passwd" /etc/passwd
mount --bind "$root/group" /etc/group
virtlogd --config "$root/etc/virtlogd.conf" --pid-file "$root/virtlogd.pid" &
echo $! > "$root/virtlogd.spid"
exec libvirtd --config "$root/etc/libvirtd.conf" --pid-file "$root/libvirtd.pid"
"""


def need(what: str, reason: str | None) -> None:
    """Skip for missing software, or fail under HPVC_REQUIRE_ALL=1 (make setup installs it)."""
    if reason is None:
        return
    if os.environ.get("HPVC_REQUIRE_ALL") == "1":
        pytest.fail(f"required by HPVC_REQUIRE_ALL=1: {what}: {reason}")
    pytest.skip(f"{what}: {reason}")


def qemu_driver() -> str | None:
    """libvirt's QEMU driver module (Debian: /usr/lib/<triplet>/libvirt/connection-driver)."""
    patterns = ("/usr/lib/*/libvirt/connection-driver", "/usr/lib64/libvirt/connection-driver")
    for pattern in patterns:
        for found in sorted(glob.glob(f"{pattern}/libvirt_driver_qemu.so")):
            return found
    return None


def requires_libvirt() -> None:
    requires("root", "qemu")
    for tool in ("libvirtd", "virtlogd", "unshare"):
        need(tool, None if shutil.which(tool) else "not installed (make setup)")
    need("libvirt QEMU driver", None if qemu_driver() else "libvirt-daemon-driver-qemu missing")
    try:
        vm_libvirt._lv()
    except MissingDependency as e:
        need("libvirt-python", e.line())


# --- a private libvirtd --------------------------------------------------------------


def _with_user(path: str, line: str) -> str:
    text = Path(path).read_text()
    if any(x.split(":", 1)[0] == QEMU_USER for x in text.splitlines()):
        return text
    return text + ("" if text.endswith("\n") else "\n") + line + "\n"


@dataclass
class PrivateLibvirtd:
    """libvirtd + virtlogd in a mount namespace of their own, configured under ``root``."""

    root: Path
    proc: subprocess.Popen[bytes] | None = None
    start_s: float = 0.0  # until it answered and had probed QEMU
    made_dirs: list[Path] = field(default_factory=list)

    @property
    def uri(self) -> str:
        return f"qemu:///system?socket={self.root / 'sock' / 'libvirt-sock'}"

    def configure(self) -> None:
        for sub in (*PRIVATE_DIRS, "sock", "drivers"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        etc, log = self.root / "etc", self.root / "daemon-logs"
        log.mkdir(exist_ok=True)
        (etc / "libvirtd.conf").write_text(
            f'unix_sock_dir = "{self.root / "sock"}"\n'
            'unix_sock_rw_perms = "0700"\nunix_sock_ro_perms = "0700"\n'
            'unix_sock_admin_perms = "0700"\nauth_unix_rw = "none"\nauth_unix_ro = "none"\n'
            f'log_outputs = "3:file:{log / "libvirtd.log"}"\n'
        )
        (etc / "virtlogd.conf").write_text(
            f'log_outputs = "3:file:{log / "virtlogd.log"}"\n'
            # What bounds a node's serial log under libvirt (hpvc's max_console
            # does not reach virtlogd): 1 MiB, one rotated file (docs/libvirt.md).
            "max_size = 1048576\nmax_backups = 1\n"
        )
        (etc / "qemu.conf").write_text(
            'user = "root"\ngroup = "root"\n'
            "dynamic_ownership = 0\nremember_owner = 0\n"  # never chown the shared guest cache
            'security_driver = "none"\n'
            "cgroup_controllers = [ ]\n"  # no machine cgroups on this shared host
        )
        uid = "64055"
        (self.root / "passwd").write_text(
            _with_user("/etc/passwd", f"{QEMU_USER}:x:{uid}:{uid}::/nonexistent:/usr/sbin/nologin")
        )
        (self.root / "group").write_text(_with_user("/etc/group", f"{QEMU_USER}:x:{uid}:"))
        driver = qemu_driver()
        assert driver is not None
        link = self.root / "drivers" / os.path.basename(driver)
        if not link.exists():
            link.symlink_to(driver)

    def start(self) -> None:
        self.configure()
        for target in PRIVATE_DIRS.values():  # bind-mount targets; removed again if made here
            path = Path(target)
            if not path.exists():
                path.mkdir(parents=True)
                self.made_dirs.append(path)
        env = {**os.environ, "LIBVIRT_DRIVER_DIR": str(self.root / "drivers")}
        started = time.monotonic()
        with open(self.root / "daemon-logs" / "stdio.log", "wb") as out:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--",
                 "sh", "-ec", START_SCRIPT, "sh", str(self.root)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                env=env, start_new_session=True,
            )  # fmt: skip
        self._wait_ready()
        self.start_s = time.monotonic() - started

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + DAEMON_START_S
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"private libvirtd exited ({self.proc.returncode}): {self.logs()}")
            try:
                conn = vm_libvirt.connect(self.uri)
            except MissingDependency:
                if time.monotonic() > deadline:
                    pytest.fail(f"private libvirtd did not answer: {self.logs()}")
                time.sleep(0.1)
                continue
            try:  # libvirt probes QEMU once (cached after): not part of a domain's start
                conn.getDomainCapabilities(None, "x86_64", "q35", "qemu")
            finally:
                conn.close()
            return

    def logs(self) -> str:
        parts = []
        for name in ("stdio.log", "libvirtd.log", "virtlogd.log"):
            path = self.root / "daemon-logs" / name
            parts.append(f"{name}: " + " | ".join(console.tail(path)))
        return "; ".join(parts)

    def remove_domains(self) -> list[str]:
        """Every domain this daemon has (all made by these tests), destroyed and undefined."""
        conn = vm_libvirt.connect(self.uri)
        try:
            names = [str(d.name()) for d in conn.listAllDomains()]
            for name in names:
                vm_libvirt.remove_domain(conn, name)
            return names
        finally:
            conn.close()

    def _virtlogd_pid(self) -> int | None:
        try:
            pid = int((self.root / "virtlogd.spid").read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            return None
        return pid if str(self.root) in cmdline and "virtlogd" in cmdline else None

    def stop(self) -> None:
        """Stop libvirtd, then virtlogd, by PID (SIGTERM, then SIGKILL); remove the mount points."""
        virtlogd = self._virtlogd_pid()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if virtlogd is not None:
            _stop_pid(virtlogd, str(self.root))
        for path in reversed(self.made_dirs):
            with contextlib.suppress(OSError):  # not empty: someone else's libvirt uses it now
                path.rmdir()


def _alive(pid: int, marker: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return marker in cmdline and procfs.running(pid)


def _stop_pid(pid: int, marker: str) -> None:
    """SIGTERM, then SIGKILL, a process while its command line still holds ``marker``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _alive(pid, marker):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while _alive(pid, marker) and time.monotonic() < deadline:
            time.sleep(0.05)


@contextlib.contextmanager
def running_libvirtd(
    root: Path, revive: Callable[[PrivateLibvirtd], None] | None = None
) -> Iterator[PrivateLibvirtd]:
    """A private libvirtd in ``root``; afterwards its domains are removed and it
    stops. ``revive``: how to start it again when a test left it stopped (so
    its domains can go too)."""
    requires_libvirt()
    daemon = PrivateLibvirtd(root)
    try:
        daemon.start()
        yield daemon
    finally:
        try:
            stopped = daemon.proc is not None and daemon.proc.poll() is not None
            if stopped and revive is not None:
                revive(daemon)
            if daemon.proc is not None and daemon.proc.poll() is None:
                daemon.remove_domains()
        finally:
            daemon.stop()


@pytest.fixture(scope="module")
def libvirtd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateLibvirtd]:
    with running_libvirtd(tmp_path_factory.mktemp("libvirtd")) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def guest() -> GuestArtifacts:
    requires_libvirt()
    image_ready()
    return build_guest(resolve_image("hpc"))


# --- one node ------------------------------------------------------------------------


@dataclass
class Node:
    """One test's cluster of one node: plan, journal, context, and what to check afterwards."""

    tmp: Path
    cluster: str
    journal: Journal = field(init=False)

    def __post_init__(self) -> None:
        self.journal = Journal(self.tmp / "journal")

    def plan(self) -> Plan:
        spec = Spec.model_validate(
            {
                "name": self.cluster,
                "kind": "vm",
                "network": {"subnet": f"{SUBNET}.0/24", "mtu": 9000},
                "tuning": {"pinning": "dedicated", "hugepages": "none", "partition": "commodity"},
                "nodes": [{"role": "compute", "vcpus": 1, "memory": "256MiB"}],
            }
        )
        try:
            return plan_cluster(spec, [("local", read_topology("/"))])
        except DoesNotFit as e:  # too few CPUs or too little memory: hardware
            pytest.skip(f"this host cannot hold the node: {e}")

    def bridge(self, plan: Plan) -> None:
        n = plan.network
        net.ensure_bridge(self.journal, n.bridge, n.gateway, n.prefixlen, n.mtu)

    def context(self, plan: Plan, node: PlannedNode, guest: GuestArtifacts) -> RenderContext:
        base = RenderContext(base_dir=str(self.tmp / "state"))
        node_dir = Path(base.node_dir(plan.cluster, node.name))
        node_dir.mkdir(parents=True)
        disk = node_disk(guest.disk, node_dir / "disk.qcow2", "qcow2")
        pub = ssh_key(self.tmp).with_suffix(".pub").read_text().strip()
        ip = f"{node.ip}/{plan.network.prefixlen}"
        return RenderContext(
            base_dir=base.base_dir,
            accel="tcg",
            kernel=str(guest.kernel),
            initrd=str(guest.initrd),
            cmdline=kernel_cmdline(node.name, ip, plan.network.mtu, pub),
            disk_images=((node.name, str(disk)),),
            disk_format="qcow2",
        )

    def leftovers(self, plan: Plan) -> list[str]:
        links = [plan.network.bridge, *(tap_name(plan.cluster, n.name) for n in plan.nodes)]
        return [f"link {x}" for x in links if os.path.exists(f"/sys/class/net/{x}")]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    env = Node(tmp_path, f"lv{PID % 100000}{next(_LABELS)}")
    yield env
    errors = env.journal.undo_all()
    for change in env.journal.entries():  # undo failed: remove our bridge by hand
        if change.kind == "bridge":
            subprocess.run(["ip", "link", "del", change.args["name"]], check=False)
    assert errors == []


def domain_names(daemon: PrivateLibvirtd) -> list[str]:
    conn = vm_libvirt.connect(daemon.uri)
    try:
        return [str(d.name()) for d in conn.listAllDomains()]
    finally:
        conn.close()


def assert_undefined(daemon: PrivateLibvirtd, name: str) -> None:
    assert name not in domain_names(daemon)
    conn = vm_libvirt.connect(daemon.uri)
    try:
        assert vm_libvirt.qemu_pid(conn, name) is None
        with pytest.raises(HpvcError, match="not defined"):
            vm_libvirt.read_back(conn, name)
    finally:
        conn.close()


# --- tests ---------------------------------------------------------------------------


def answers_then_goes(
    libvirtd: PrivateLibvirtd, store: Store, name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """compute0 answers `hostname` inside; down leaves no domain and nothing else."""
    capfd.readouterr()
    assert ops.exec_node(name, "compute0", ["hostname"], store) == 0
    assert capfd.readouterr().out.strip() == "compute0"
    lifecycle.down(name, store)
    assert domain_names(libvirtd) == []
    assert vm_leftovers(name, store) == []


def acl_holders(top: Path, uid: int) -> list[Path]:
    """``top`` and the files under it whose ACL has an entry for ``uid``."""
    found = []
    for path in [top, *top.rglob("*")]:
        if (
            not path.is_symlink()
            and qemu_access.user_perm(qemu_access.read_acl(path), uid) is not None
        ):
            found.append(path)
    return found


def teardown_all(store: Store) -> None:
    """Whatever a failed test left in ``store``: every cluster, then host-wide changes."""
    for n in {p.name for p in (store.root / "clusters").glob("*")}:
        lifecycle.teardown(store, n)
    store.host_journal().undo_all()


def test_boot_pin_read_back_undo(
    libvirtd: PrivateLibvirtd, guest: GuestArtifacts, node: Node
) -> None:
    plan = node.plan()
    vm = plan.nodes[0]
    assert vm.vcpus[0].pcpu is not None
    node.bridge(plan)
    ctx = node.context(plan, vm, guest)
    xml = render_domain_xml(plan, vm, ctx)
    name = domain_name(plan, vm)
    conn = vm_libvirt.connect(libvirtd.uri)
    try:
        started = time.monotonic()
        pid = vm_libvirt.start_domain(node.journal, conn, xml, name)
        start_s = time.monotonic() - started
        log = Path(ctx.console_log(plan.cluster, vm.name))
        boot_s = console.wait_ready(log, f"hpvc-ready {vm.name}", READY_TIMEOUT_S, pid)
        print(
            f"\nlibvirt: private libvirtd up in {libvirtd.start_s:.2f} s; "
            f"define+start {start_s:.2f} s, then hpvc-ready after {boot_s:.2f} s"
        )
        assert [c.kind for c in node.journal.entries()] == ["bridge", "libvirt-domain"]

        back = vm_libvirt.read_back(conn, name)
        want = [vm.vcpus[0].pcpu]
        assert (back["state"], back["pid"], back["uuid"]) == ("running", pid, domain_uuid(plan, vm))
        (vcpu,) = back["vcpus"]
        assert (vcpu["vcpu"], vcpu["pinned"], vcpu["cpus"]) == (0, want, want)
        assert vcpu["running_on"] in want
        assert vcpu["tid"] is not None and os.sched_getaffinity(vcpu["tid"]) == set(want)
        assert back["emulator"]["pinned"] == list(vm.emulator_cpus)
        assert back["emulator"]["cpus"] == list(vm.emulator_cpus)
        assert back["memory_kib"] == vm.memory_mib * 1024
        mem = back["memory_backing"]
        assert (mem["nosharepages"], mem["allocation"], mem["hugepages"]) == (True, "immediate", [])
        if vm.numa:
            assert back["numa"]["mode"] == "strict"
            hosts = sorted({c.host_node for c in vm.numa})
            assert back["numa"]["cells"] == [
                {"cellid": c.guest_node, "mode": "strict", "nodeset": str(c.host_node)}
                for c in vm.numa
            ]
            assert back["numa"]["nodeset"] == ",".join(map(str, hosts))

        tap = Path("/sys/class/net") / tap_name(plan.cluster, vm.name)  # libvirt made it
        assert os.path.basename(os.readlink(tap / "master")) == plan.network.bridge
        assert int((tap / "mtu").read_text()) == plan.network.mtu
        argv = ssh_argv(node.tmp, vm.ip, ["sh", "-c", "hostname; cat /sys/class/net/eth0/mtu"])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [vm.name, str(plan.network.mtu)]
    finally:
        conn.close()

    assert node.journal.undo_all() == []
    assert_undefined(libvirtd, name)
    assert not vm_libvirt.is_domain_qemu(pid, name, back["uuid"])
    assert node.leftovers(plan) == []


def test_an_xml_libvirt_rejects_is_one_line_and_leaves_nothing(
    libvirtd: PrivateLibvirtd, guest: GuestArtifacts, node: Node
) -> None:
    plan = node.plan()
    vm = plan.nodes[0]
    xml = render_domain_xml(plan, vm, node.context(plan, vm, guest))
    name = domain_name(plan, vm)
    conn = vm_libvirt.connect(libvirtd.uri)
    try:
        bad = xml.replace("<on_crash>", "<no-such-element /><on_crash>")
        with pytest.raises(HpvcError) as err:
            vm_libvirt.start_domain(node.journal, conn, bad, name)
        line = str(err.value)
        assert "\n" not in line and "no-such-element" in line, line
        assert line.startswith(f"libvirt domain {name}: XML document failed to validate")
        assert [c.kind for c in node.journal.entries()] == ["libvirt-domain"]

        with pytest.raises(InputError, match="not well-formed"):  # refused before libvirt
            vm_libvirt.start_domain(node.journal, conn, xml.replace("</domain>", ""), name)
        assert len(node.journal.entries()) == 1
    finally:
        conn.close()
    assert_undefined(libvirtd, name)


def test_a_domain_that_cannot_start_leaves_nothing(
    libvirtd: PrivateLibvirtd, guest: GuestArtifacts, node: Node
) -> None:
    plan = node.plan()
    vm = plan.nodes[0]
    node.bridge(plan)
    xml = render_domain_xml(plan, vm, node.context(plan, vm, guest))
    missing = str(node.tmp / "no-such-kernel")
    xml = xml.replace(str(guest.kernel), missing)
    name = domain_name(plan, vm)
    conn = vm_libvirt.connect(libvirtd.uri)
    try:
        with pytest.raises(HpvcError) as err:
            vm_libvirt.start_domain(node.journal, conn, xml, name)
        line = str(err.value)
        assert "\n" not in line and missing in line, line
        assert line.endswith(f"(see /var/log/libvirt/qemu/{name}.log on the libvirt host)")
    finally:
        conn.close()
    assert_undefined(libvirtd, name)
    assert not os.path.exists(f"/sys/class/net/{tap_name(plan.cluster, vm.name)}")


def test_an_existing_domain_is_refused_and_not_journaled(
    libvirtd: PrivateLibvirtd, guest: GuestArtifacts, node: Node
) -> None:
    plan = node.plan()
    vm = plan.nodes[0]
    xml = render_domain_xml(plan, vm, node.context(plan, vm, guest))
    name = domain_name(plan, vm)
    conn = vm_libvirt.connect(libvirtd.uri)
    try:
        conn.defineXML(xml)  # someone else's domain of that name (defined, not running)
        with pytest.raises(HpvcError, match="already defined"):
            vm_libvirt.start_domain(node.journal, conn, xml, name)
        assert node.journal.entries() == []
        assert name in domain_names(libvirtd)
        assert vm_libvirt.remove_domain(conn, name) is True
        assert vm_libvirt.remove_domain(conn, name) is False
    finally:
        conn.close()
    assert_undefined(libvirtd, name)


# --- the lifecycle with backend = "libvirt" --------------------------------------------


def test_cluster_up_status_exec_down_through_libvirt(
    libvirtd: PrivateLibvirtd,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HPVC_LIBVIRT_URI", libvirtd.uri)
    store = Store(tmp_path / "state")
    name = f"l{os.getpid() % 10000}"
    spec = Path(vm_spec(tmp_path, name, computes=1))
    text = spec.read_text().replace('kind = "vm"', 'kind = "vm"\nbackend = "libvirt"')
    # libvirtd finds hugetlbfs mounts when it starts (docs/libvirt.md): none here.
    spec.write_text(text.replace('hugepages = "2M"', 'hugepages = "none"'))
    try:
        lifecycle.up(str(spec), store)
        st = ops.status(name, store)
        assert st["backend"] == "libvirt"
        assert sorted(domain_names(libvirtd)) == [f"hpvc-{name}-compute0", f"hpvc-{name}-head0"]
        for n in st["nodes"]:  # libvirt applied the plan's pinning from <cputune>
            assert n["state"] == "running"
            assert [v["cpus"] for v in n["vm"]["vcpus"]] == [n["planned"]["cpus"]]
        # Every QEMU runs as the cluster's own uid (its DAC label), under seccomp,
        # and owns no file: its access is ACL entries, gone with the cluster.
        uid = assert_confined(f"guest=hpvc-{name}-", 2)
        assert uid == qemu_user.find(store.root, name)
        assert [p for p in store.root.rglob("*") if p.lstat().st_uid == uid] == []
        assert acl_holders(store.root, uid) != []
        assert_agent_key_reached_the_guests(name, store, capfd, "head0", "compute0")
        # Its nodes share the cluster's ivshmem region: a move (save and restore)
        # would write the saved region back over the other's writes, so refused.
        from hpvc.cluster.migrate import migrate

        with pytest.raises(InputError, match="shares an ivshmem region"):
            migrate(name, "compute0", store=store)
        answers_then_goes(libvirtd, store, name, capfd)
        assert acl_holders(store.root, uid) == []
    finally:
        teardown_all(store)


def test_a_libvirt_node_moves_by_save_and_restore(
    libvirtd: PrivateLibvirtd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27, libvirt backend: hpvc migrate saves compute0's domain and restores
    it at its new place (libvirt/migrate.py): a new QEMU under the same domain
    name and UUID, libvirt's read-back pins as the new plan says, the guest up
    with the file it had (the guest's state came along) and answering; the save
    file is gone; a place libvirt cannot start is undone (the node restored where
    it was, its state kept, the record as it was); --postcopy is refused in one
    line, exit 2; down leaves nothing."""
    import json
    import sys

    from hpvc.cluster.migrate import migrate
    from tests.integration.test_cluster import cli_env

    monkeypatch.setenv("HPVC_LIBVIRT_URI", libvirtd.uri)
    store = Store(tmp_path / "state")
    name = f"lm{os.getpid() % 10000}"
    spec = Path(vm_spec(tmp_path, name, computes=1))
    text = spec.read_text().replace('kind = "vm"', 'kind = "vm"\nbackend = "libvirt"')
    text = text.replace("[tuning]\n", '[tuning]\nlocality = "none"\n')  # no region: it moves
    spec.write_text(text.replace('hugepages = "2M"', 'hugepages = "none"'))
    try:
        lifecycle.up(str(spec), store)
        argv = ["sh", "-c", "echo kept > /dev/shm/mark"]  # guest memory (tmpfs), not its disk
        assert (
            subprocess.run(ops.exec_argv(name, "compute0", argv, store), timeout=60).returncode == 0
        )
        old_pid = ops.node_pid(name, "compute0", store)
        r = subprocess.run(
            [sys.executable, "-m", "hpvc", "migrate", name, "compute0", "--postcopy"],
            env={**cli_env(store), "HPVC_LIBVIRT_URI": libvirtd.uri}, capture_output=True,
            text=True, check=False,
        )  # fmt: skip
        assert r.returncode == 2 and "no postcopy phase" in r.stderr, r.stderr
        assert ops.node_pid(name, "compute0", store) == old_pid
        # A new place libvirt cannot start (a CPU this host lacks): restored where it was.
        from hpvc.backends.libvirt import migrate as lv_move
        from hpvc.backends.vm.migration import MigrationFailed

        def nowhere(xml: str, node: PlannedNode) -> str:
            return xml.replace("<vcpu ", "<vcpu cpuset='4000' ", 1)

        monkeypatch.setattr(lv_move, "placed_domain_xml", nowhere)
        was = store.get(name).plan
        with pytest.raises(MigrationFailed):
            migrate(name, "compute0", store=store)
        monkeypatch.undo()
        monkeypatch.setenv("HPVC_LIBVIRT_URI", libvirtd.uri)
        assert store.get(name).plan == was and store.get(name).status == "running"
        back = subprocess.run(ops.exec_argv(name, "compute0", ["cat", "/dev/shm/mark"], store),
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert back.stdout == "kept\n", back
        old_pid = ops.node_pid(name, "compute0", store)
        out = migrate(name, "compute0", store=store)
        assert out["migration"]["stop_and_copy"] is True and out["migration"]["bytes_sent"] > 0
        assert out["pid"] != old_pid and not procfs.running(old_pid)
        assert sorted(domain_names(libvirtd)) == [f"hpvc-{name}-compute0", f"hpvc-{name}-head0"]
        got = subprocess.run(ops.exec_argv(name, "compute0", ["cat", "/dev/shm/mark"], store),
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert got.stdout == "kept\n", got
        node = next(n for n in ops.status(name, store)["nodes"] if n["name"] == "compute0")
        assert node["state"] == "running"
        assert [v["cpus"] for v in node["vm"]["vcpus"]] == [node["planned"]["cpus"]]
        assert not list(store.root.rglob("move.save"))
        assert json.dumps(out)  # the report is plain data (--json)
    finally:
        teardown_all(store)

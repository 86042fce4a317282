"""The VM agents' key: handed to the guests by file (fw_cfg), never on a command
line; one random key per cluster, one derived key per Slurm job across hosts."""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path

import pytest

from hpvc.backends import agentkey
from hpvc.errors import MissingDependency
from hpvc.plan.overlay import Overlay
from hpvc.render import qemu_argv
from hpvc.store import Store
from tests.unit.test_render import ctx, dom, hand_vm_plan

KEY = "/var/lib/hpvc/clusters/demo/agent.key"


def test_qemu_gets_the_key_file_as_a_fw_cfg_entry() -> None:
    plan = hand_vm_plan()
    node = plan.nodes[0]
    argv = qemu_argv(plan, node, ctx(agent_key=KEY))
    i = argv.index("-fw_cfg")
    assert argv[i + 1] == f"name=opt/hpvc/agent-key,file={KEY}"
    assert "-fw_cfg" not in qemu_argv(plan, node, ctx())


def test_libvirt_gets_the_key_file_as_a_fwcfg_sysinfo_entry() -> None:
    plan = hand_vm_plan()
    d = dom(plan, plan.nodes[0].name, ctx(agent_key=KEY))
    entry = d.find("sysinfo[@type='fwcfg']/entry")
    assert entry is not None
    assert entry.attrib == {"name": "opt/hpvc/agent-key", "file": KEY}
    assert dom(plan, plan.nodes[0].name).find("sysinfo") is None


def _store(tmp_path: Path, cluster: str) -> Store:
    store = Store(tmp_path)
    store.cluster_dir(cluster).mkdir(parents=True)
    return store


def test_a_cluster_gets_its_own_random_key_made_once(tmp_path: Path) -> None:
    store = _store(tmp_path, "a")
    store.cluster_dir("b").mkdir(parents=True)
    path = agentkey.agent_key(store, "a")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_bytes()) == 32
    assert agentkey.agent_key(store, "a").read_bytes() == path.read_bytes()  # kept
    assert agentkey.agent_key(store, "b").read_bytes() != path.read_bytes()


def test_a_jobs_shares_derive_one_key_from_the_sites(tmp_path: Path) -> None:
    hosts = [tmp_path / "h1", tmp_path / "h2"]
    site = os.urandom(32)
    keys = []
    for i, root in enumerate(hosts):
        store = _store(root, f"j7-{i}")
        (root / agentkey.SITE_AGENT_KEY).write_bytes(site)
        keys.append(agentkey.agent_key(store, f"j7-{i}", "slurm-job-7").read_bytes())
    assert keys[0] == keys[1]
    assert keys[0] == hmac.new(site, b"hpvc-agent-key slurm-job-7", hashlib.sha256).digest()
    store = _store(hosts[0], "j8-0")  # another job on the same host: another key
    assert agentkey.agent_key(store, "j8-0", "slurm-job-8").read_bytes() != keys[0]


def test_a_job_across_hosts_without_the_site_key_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path, "j8-0")
    with pytest.raises(MissingDependency, match=r"agent-site\.key"):
        agentkey.agent_key(store, "j8-0", "slurm-job-8")


def test_the_overlay_carries_the_key_id() -> None:
    o = Overlay(vni=5, local="10.0.0.1", remotes=(), mtu=1450, key_id="slurm-job-7")
    assert Overlay.from_json(o.to_json()).key_id == "slurm-job-7"

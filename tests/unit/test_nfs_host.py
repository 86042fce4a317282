"""The pure parts of the NFS server and client: Ganesha's config, the launcher,
finding the client, and what ``health`` says of a folder that is no mount."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.errors import InputError, MissingDependency
from hpvc.host import nfs_backing, nfs_mount, nfs_server

FOLDER = Path("/var/lib/hpvc/clusters/c1/nodes/head0/nfs-server")


def config(**over: object) -> str:
    args: dict[str, object] = {
        "export_dir": Path("/var/lib/hpvc/clusters/c1/export"),
        "folder": FOLDER,
        "subnet": "10.88.3.0/24",
        "address": "10.88.3.2",
        "root_squash": True,
    }
    args.update(over)
    return nfs_server.render_config(**args)  # type: ignore[arg-type]


def setting(text: str, key: str) -> list[str]:
    """Every value of ``key = value;`` in the config, comments dropped."""
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith(f"{key} =") or line.startswith(f"{key}="):
            out.append(line.split("=", 1)[1].strip().rstrip(";").strip())
    return out


def test_config_exports_to_the_subnet_only() -> None:
    text = config()
    assert setting(text, "Clients") == ["10.88.3.0/24"]
    # The export grants nothing by itself: only the CLIENT block gives RW.
    assert setting(text, "Access_Type") == ["None", "RW"]
    assert (
        text.index("Access_Type = None") < text.index("CLIENT {") < text.index("Access_Type = RW")
    )
    assert setting(text, "Bind_Addr") == ["10.88.3.2"]
    assert setting(text, "Path") == ['"/var/lib/hpvc/clusters/c1/export"']
    assert setting(text, "Pseudo") == ['"/shared"']


def test_config_squash_follows_the_tenancy() -> None:
    assert setting(config(root_squash=True), "Squash") == ["root_squash"]
    assert setting(config(root_squash=False), "Squash") == ["no_root_squash"]
    assert setting(config(), "Anonymous_Uid") == [str(nfs_server.ANON_ID)]


def test_config_is_graceless_tcp_only_and_keeps_its_state_in_its_folder() -> None:
    text = config(pseudo="/data")
    assert setting(text, "Pseudo") == ['"/data"']
    assert setting(text, "Graceless") == ["true"]
    assert setting(text, "Enable_UDP") == ["false"]
    assert setting(text, "Enable_NLM") == ["false"]
    assert setting(text, "Enable_RQUOTA") == ["false"]
    assert setting(text, "Transports") == ["TCP"]
    assert setting(text, "NFS_Port") == [str(nfs_server.NFS_PORT)]
    assert setting(text, "MNT_Port") == [str(nfs_server.MOUNT_PORT)]
    # Nothing host-global: recovery and credential cache live in the folder.
    assert setting(text, "RecoveryRoot") == [f'"{FOLDER}/recovery"']
    assert setting(text, "CCacheDir") == [f'"{FOLDER}/run"']
    assert setting(text, "MaxWrite") == [str(1 << 20)]
    assert text.count("{") == text.count("}")


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"address": "10.88.4.2"}, "not in the cluster subnet"),
        ({"subnet": "10.88.3.1/24"}, "host bits set"),
        ({"export_dir": Path("relative/export")}, "absolute path"),
        ({"export_dir": Path('/x/"; Squash = none; "')}, "absolute path"),
        ({"pseudo": "shared"}, "absolute path"),
    ],
)
def test_config_refuses_what_would_widen_or_break_it(over: dict[str, object], why: str) -> None:
    with pytest.raises(InputError, match=why):
        config(**over)


def test_launcher_waits_to_be_journaled_then_enters_the_namespaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nfs_server, "_tool", lambda name, package: f"/usr/sbin/{name}")
    procs = Path("/sys/fs/cgroup/memory/hpvc/c1/cgroup.procs")
    text = nfs_server.render_launcher(
        folder=FOLDER, netns_path="/run/netns/hpvc-c1-head0", cgroup_procs=procs
    )
    assert text.index("read -r go") < text.index(f"procs={procs}") < text.index("exec ")
    assert "--net=/run/netns/hpvc-c1-head0" in text
    assert "--mount --propagation private" in text and "mount -t tmpfs" in text
    assert f"DBUS_SYSTEM_BUS_ADDRESS=unix:path={FOLDER}/no-dbus" in text
    assert f"-f {FOLDER}/ganesha.conf -L {FOLDER}/ganesha.log" in text
    none = nfs_server.render_launcher(folder=FOLDER, netns_path="/run/netns/x", cgroup_procs=None)
    assert "procs=''" in none


def test_client_binary_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nfs_mount.os, "access", lambda path, mode: False)
    with pytest.raises(MissingDependency) as e:
        nfs_mount.client_binary()
    assert "make -C native/nfsfuse" in e.value.line()


def test_health_of_a_folder_that_is_no_mount(tmp_path: Path) -> None:
    assert nfs_mount.health(tmp_path) == "not mounted"
    assert nfs_mount.health(tmp_path / "missing") == "not mounted"


def test_loop_image_lies_beside_its_mount_point() -> None:
    assert nfs_backing.image_of(Path("/s/shared/c1")) == Path("/s/shared/c1.img")

"""ACL entries that let a libvirt domain's QEMU (its cluster's uid) open its files,
the files a domain XML names, and the DAC label the renderer gives the domain."""

from __future__ import annotations

import os
import shutil
import struct
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hpvc.backends.libvirt.domain_xml import qemu_opens
from hpvc.host import qemu_access as qa
from hpvc.host.journal import Journal
from hpvc.paths import open_to_others
from hpvc.render.libvirt import render_domain_xml
from tests.unit.test_render import _validate, ctx, hand_vm_plan

UID = 0x7E000000 + 7
OTHER_UID = UID + 1


def acl_of(path: Path) -> list[qa.Entry] | None:
    try:
        return qa.parse(os.getxattr(path, qa.XATTR))
    except OSError:
        return None


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A root-only folder holding a root-only file, as hpvc's state."""
    top = tmp_path / "state"
    (top / "nodes").mkdir(parents=True, mode=0o700)
    top.chmod(0o700)
    (top / "nodes").chmod(0o700)
    disk = top / "nodes" / "disk.qcow2"
    disk.write_bytes(b"")
    disk.chmod(0o600)
    try:
        os.setxattr(disk, qa.XATTR, qa.pack(qa.from_mode(0o600)))
    except OSError as e:
        pytest.skip(f"no POSIX ACLs on {tmp_path}: {e}")
    return top


def test_pack_parse_round_trip_in_kernel_order() -> None:
    entries = [(qa.OTHER, 0, qa.NO_ID), (qa.USER, 4, UID), (qa.USER_OBJ, 6, qa.NO_ID)]
    raw = qa.pack(entries)
    assert raw[:4] == struct.pack("<I", 2) and len(raw) == 4 + 3 * 8
    assert qa.parse(raw) == sorted(entries)
    with pytest.raises(ValueError):
        qa.parse(struct.pack("<I", 1))


def test_with_user_keeps_the_mask_the_group_class_union() -> None:
    base = qa.from_mode(0o640)
    one = qa.with_user(base, UID, qa.R | qa.W)
    assert (qa.MASK, 6, qa.NO_ID) in one and (qa.USER, 6, UID) in one
    assert qa.with_user(one, UID, None) == sorted(base)  # no named entry: no mask


def test_grant_gives_traversal_and_access_and_undo_takes_them_back(
    tree: Path, tmp_path: Path
) -> None:
    disk = tree / "nodes" / "disk.qcow2"
    lock = tmp_path / "acl.lock"
    j = Journal(tmp_path / "journal")
    modes = {p: os.stat(p).st_mode for p in (tree, tree / "nodes", disk)}
    qa.grant(j, UID, disk, "rw", lock=lock)
    qa.grant(j, UID, disk, "rw", lock=lock)  # again: nothing more
    assert qa.allows(disk, UID, qa.R | qa.W) and qa.allows(tree / "nodes", UID, qa.X)
    assert not qa.allows(tree, UID, qa.R)  # traversal, not listing
    assert not qa.allows(disk, OTHER_UID, qa.R)
    changed = [c.args["path"] for c in j.entries()]
    assert str(disk) in changed and str(tree) in changed and len(changed) == len(set(changed))
    assert all(c.kind == "qemu-acl" for c in j.entries())
    # hpvc's own check still finds its folder closed to others
    assert not open_to_others(tree, os.stat(tree))
    # a chmod (private_dir's tighten, once) masks the entry; a new grant mends it
    tree.chmod(0o700)
    assert not qa.allows(tree, UID, qa.X)
    qa.grant(j, UID, disk, "rw", lock=lock)
    assert qa.allows(tree, UID, qa.X)

    assert j.undo_all() == []
    for path, mode in modes.items():
        assert acl_of(path) in (None, sorted(qa.from_mode(mode)))
        assert os.stat(path).st_mode == mode, path


def test_undo_keeps_another_uids_entry(tree: Path, tmp_path: Path) -> None:
    disk = tree / "nodes" / "disk.qcow2"
    lock = tmp_path / "acl.lock"
    mine, theirs = Journal(tmp_path / "mine"), Journal(tmp_path / "theirs")
    qa.grant(theirs, OTHER_UID, disk, "r", lock=lock)
    qa.grant(mine, UID, disk, "rw", lock=lock)
    assert mine.undo_all() == []
    assert not qa.allows(disk, UID, qa.R) and qa.allows(disk, OTHER_UID, qa.R)
    assert not qa.allows(disk, OTHER_UID, qa.W)
    assert theirs.undo_all() == []
    assert acl_of(disk) in (None, sorted(qa.from_mode(0o600)))


def test_two_state_roots_granting_one_folder_at_once_keep_both_entries(
    tree: Path, tmp_path: Path
) -> None:
    # Two Slurm test hosts (a state root and so a lock each) checkpoint at once
    # and both add an entry to a folder above their state roots (issue 28).
    # The second grant starts while the first holds the folder's ACL read
    # but not yet written: it must wait, not write over the first.
    folder = tree / "nodes"
    real = qa.read_acl
    second: list[threading.Thread] = []

    me = threading.current_thread()
    reads: list[Path] = []

    def read_then_race(path: Path) -> list[qa.Entry]:
        entries = real(path)
        if threading.current_thread() is me and path == folder:
            reads.append(path)  # 1: allows() asks; 2: the read before the write
        if len(reads) == 2 and not second:
            theirs = Journal(tmp_path / "theirs")
            t = threading.Thread(
                target=qa.traverse,
                args=(theirs, OTHER_UID, folder),
                kwargs={"lock": tmp_path / "b.lock"},
            )
            second.append(t)
            t.start()
            t.join(0.5)  # without the folder's own lock it is done by now
        return entries

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(qa, "read_acl", read_then_race)
        qa.traverse(Journal(tmp_path / "mine"), UID, folder, lock=tmp_path / "a.lock")
    finally:
        mp.undo()
        for t in second:
            t.join()
    assert second
    assert qa.allows(folder, UID, qa.X) and qa.allows(folder, OTHER_UID, qa.X)


def test_undo_of_a_path_that_is_gone(tree: Path, tmp_path: Path) -> None:
    disk = tree / "nodes" / "disk.qcow2"
    j = Journal(tmp_path / "journal")
    qa.grant(j, UID, disk, "rw", lock=tmp_path / "acl.lock")
    disk.unlink()
    assert j.undo_all() == []


def qcow2(path: Path, backing: str) -> None:
    name = backing.encode()
    head = b"QFI\xfb" + struct.pack(">I", 3) + struct.pack(">QI", 104, len(name))
    path.write_bytes(head.ljust(104, b"\0") + name)


def test_backing_chain_of_a_qcow2_overlay(tmp_path: Path) -> None:
    (tmp_path / "base.raw").write_bytes(b"\0" * 512)
    qcow2(tmp_path / "mid.qcow2", str(tmp_path / "base.raw"))
    qcow2(tmp_path / "top.qcow2", "mid.qcow2")  # relative: beside the overlay
    assert qa.backing_chain(tmp_path / "top.qcow2") == [
        tmp_path / "mid.qcow2",
        tmp_path / "base.raw",
    ]
    assert qa.backing_chain(tmp_path / "base.raw") == []
    assert qa.backing_chain(tmp_path / "missing") == []


def test_the_files_a_domain_xml_has_qemu_open() -> None:
    xml = """<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
      <os><kernel>/g/vmlinuz</kernel><initrd>/g/initrd.img</initrd></os>
      <sysinfo type='fwcfg'><entry name='opt/x' file='/s/c/key'/></sysinfo>
      <devices>
        <disk type='file' device='disk'><source file='/s/n/disk.qcow2'/></disk>
        <disk type='file' device='disk'><source file='/s/ro.img'/><readonly/></disk>
        <disk type='block' device='disk'><source dev='/dev/sdz'/></disk>
        <interface type='bridge'><source bridge='b'/></interface>
      </devices>
      <qemu:commandline>
        <qemu:arg value='-object'/>
        <qemu:arg value='memory-backend-file,id=m,mem-path=/shm/a,,b,size=64M,share=on'/>
      </qemu:commandline>
    </domain>"""
    assert qemu_opens(xml) == [
        ("/g/vmlinuz", "r"),
        ("/g/initrd.img", "r"),
        ("/s/n/disk.qcow2", "rw"),
        ("/s/ro.img", "r"),
        ("/s/c/key", "r"),
        ("/shm/a,b", "rw"),
    ]


def test_a_domain_gets_its_clusters_uid_as_a_dac_label_that_chowns_nothing(
    tmp_path: Path,
) -> None:
    plan = hand_vm_plan()
    node = plan.nodes[0]
    assert ET.fromstring(render_domain_xml(plan, node, ctx("tcg"))).find("seclabel") is None
    xml = render_domain_xml(plan, node, ctx("tcg", qemu_uid=UID))
    label = ET.fromstring(xml).find("seclabel")
    assert label is not None
    assert label.attrib == {"type": "static", "model": "dac", "relabel": "no"}
    assert label.findtext("label") == f"+{UID}:+{UID}"
    with pytest.raises(ValueError, match="root"):
        render_domain_xml(plan, node, ctx("tcg", qemu_uid=0))
    if shutil.which("virt-xml-validate"):
        (tmp_path / "d.xml").write_text(xml)
        _validate(tmp_path / "d.xml")

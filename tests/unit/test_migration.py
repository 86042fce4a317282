"""The pure parts of live migration (hpvc.backends.vm.migration): settings,
the QMP commands each side gets, and what a query-migrate reply says."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.backends.vm import migration as m
from hpvc.errors import InputError


def _caps(commands: list[m.Command]) -> dict[str, object]:
    name, args = commands[0]  # type: ignore[misc]
    assert name == "migrate-set-capabilities"
    return {c["capability"]: c["state"] for c in args["capabilities"]}


def test_source_gets_settings_in_qemu_units() -> None:
    s = m.MigrationSettings(bandwidth_mib_s=100, downtime_ms=30, multifd=3, auto_converge=False)
    cmds = m.source_commands(s)
    assert _caps(cmds) == {"multifd": True, "postcopy-ram": False, "auto-converge": False}
    assert cmds[1] == (
        "migrate-set-parameters",
        {"max-bandwidth": 100 << 20, "downtime-limit": 30, "multifd-channels": 3},
    )


def test_no_bandwidth_cap_is_qemus_largest_value() -> None:
    cmds = m.source_commands(m.MigrationSettings(bandwidth_mib_s=0, multifd=0))
    params = cmds[1][1]  # type: ignore[index]
    assert params["max-bandwidth"] == m.MAX_BANDWIDTH
    assert "multifd-channels" not in params


def test_target_shares_capabilities_then_listens() -> None:
    s = m.MigrationSettings(multifd=0, postcopy=True)
    cmds = m.target_commands(s, "unix:/run/x.sock")
    assert _caps(cmds) == {"multifd": False, "postcopy-ram": True}  # auto-converge: source's
    assert cmds[-1] == ("migrate-incoming", {"uri": "unix:/run/x.sock"})
    assert len(cmds) == 2
    with_fd = m.target_commands(m.MigrationSettings(multifd=4), "tcp:10.0.0.2:4444")
    assert with_fd[1] == ("migrate-set-parameters", {"multifd-channels": 4})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"downtime_ms": 0},
        {"downtime_ms": 5000},
        {"multifd": 17},
        {"bandwidth_mib_s": -1},
        {"timeout_s": 0},
        {"postcopy": True, "multifd": 2},
    ],
)
def test_bad_settings_are_input_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(InputError) as e:
        m.MigrationSettings(**kwargs)  # type: ignore[arg-type]
    assert e.value.exit_code == 2 and e.value.fix


def test_incoming_argv_appends_defer_once() -> None:
    argv = ["qemu-system-x86_64", "-name", "x"]
    assert m.incoming_argv(argv)[-2:] == ["-incoming", "defer"]
    with pytest.raises(Exception, match="already has -incoming"):
        m.incoming_argv(m.incoming_argv(argv))


def test_uris() -> None:
    assert m.unix_uri("/a/b.sock") == "unix:/a/b.sock"
    assert m.tcp_uri("10.1.2.3", 4444) == "tcp:10.1.2.3:4444"
    assert m.tcp_uri("fd00::1", 4444) == "tcp:[fd00::1]:4444"


REPLY = {
    "status": "completed",
    "total-time": 1234,
    "downtime": 17,
    "setup-time": 3,
    "cpu-throttle-percentage": 20,
    "ram": {"transferred": 5 << 20, "dirty-sync-count": 4, "mbps": 812.5, "remaining": 0},
}


def test_stats_from_a_completed_reply() -> None:
    s = m.stats(REPLY)
    assert (s.total_ms, s.downtime_ms, s.setup_ms, s.bytes_sent) == (1234, 17, 3, 5 << 20)
    assert (s.passes, s.throttle_pct, s.mbps) == (4, 20, 812.5)
    assert s.as_dict()["downtime_ms"] == 17


def test_stats_tolerate_missing_fields() -> None:
    s = m.stats({"status": "completed"})
    assert (s.total_ms, s.bytes_sent, s.mbps) == (0, 0, 0.0)


def test_progress_line() -> None:
    line = m.progress_line(
        {
            "ram": {"transferred": 3 << 20, "remaining": 7 << 20, "dirty-sync-count": 2},
            "cpu-throttle-percentage": 30,
        }
    )
    assert line == "migrating: 3 MiB sent, 7 MiB left, pass 2, vCPUs throttled 30%"


# --- the direct-QEMU target's command line (hpvc.backends.qemu.migrate) --------------

SRC = [
    "/usr/bin/qemu-system-x86_64",
    "-name",
    "hpvc-c-compute0,debug-threads=on",
    "-object",
    "memory-backend-file,id=mem0,size=256M,mem-path=/s/hp,prealloc=on,share=on,"
    "host-nodes=0,policy=bind",
    "-object",
    "memory-backend-file,id=mem1,size=256M,mem-path=/s/hp,prealloc=on,share=on,"
    "host-nodes=0,policy=bind",
    "-netdev",
    "tap,id=net0,ifname=hvaaaa,script=no,downscript=no,vhost=off",
    "-chardev",
    "socket,id=console0,path=/s/run/c/compute0/console.sock,server=on,wait=off,"
    "logfile=/s/run/c/compute0/console.fifo",
    "-qmp",
    "unix:/s/run/c/compute0/qmp.sock,server=on,wait=off",
    "-pidfile",
    "/s/run/c/compute0/qemu.pid",
]


def _target(argv: list[str]) -> list[str]:
    from hpvc.backends.qemu.migrate import target_argv

    return target_argv(
        argv,
        run_from="/s/run/c/compute0",
        run_to="/s/run/c/compute0~migrating",
        tap_from="hvaaaa",
        tap_to="hvbbbb",
        host_nodes={0: 1, 1: 3},
    )


def test_target_argv_moves_paths_tap_and_cells_only() -> None:
    out = _target(SRC)
    assert out[-2:] == ["-incoming", "defer"]
    joined = " ".join(out)
    assert "/s/run/c/compute0/" not in joined  # every socket and the pid file moved
    assert "path=/s/run/c/compute0~migrating/console.sock" in joined
    assert "unix:/s/run/c/compute0~migrating/qmp.sock" in joined
    assert "ifname=hvbbbb," in joined and "hvaaaa" not in joined
    cell = "memory-backend-file,id=mem{},size=256M,mem-path=/s/hp,prealloc=on,share=on,"
    assert out[4] == cell.format(0) + "host-nodes=1,policy=bind"
    assert out[6] == cell.format(1) + "host-nodes=3,policy=bind"
    assert out[1:3] == SRC[1:3]  # the same -name: the node's process stays findable
    # A node that moved before runs with -incoming: it is not doubled.
    again = _target(out)
    assert again.count("-incoming") == 1


def test_current_tap_and_what_cannot_move() -> None:
    from hpvc.backends.qemu.migrate import current_tap, refusal_for

    assert current_tap(SRC) == "hvaaaa"
    assert refusal_for(SRC) is None
    shm = [*SRC, "-object", f"memory-backend-file,id=ivshmem0,mem-path={REGION},size=64M,share=on",
           "-device", "ivshmem-plain,memdev=ivshmem0,master=on"]  # fmt: skip
    assert refusal_for(shm) is None  # it moves on its host, its peers stopped (region.py)
    fs = [*SRC, "-device", "vhost-user-fs-pci,chardev=fs0,tag=t"]
    assert "virtiofs" in (refusal_for(fs) or "")


def test_the_targets_changes_become_the_nodes() -> None:
    from hpvc.backends.qemu.migrate import _renamed
    from hpvc.host.journal import Change

    qemu = Change(
        "qemu-target",
        {"name": "n", "pidfile": "/r/c/n~migrating/qemu.pid", "qmp": "/r/c/n~migrating/qmp.sock"},
        "hpvc.backends.qemu.migrate",
    )
    got = _renamed(qemu, "/r/c/n~migrating", "/r/c/n")
    assert got.kind == "qemu" and got.module == "hpvc.backends.qemu.process"
    assert got.args["pidfile"] == "/r/c/n/qemu.pid"
    assert got.args["sockets"] == ["/r/c/n/qmp.sock", "/r/c/n/console.sock"]
    ring = Change("console-ring", {"fifo": "/r/c/n~migrating/console.fifo", "pid": 7}, "m")
    assert _renamed(ring, "/r/c/n~migrating", "/r/c/n").args == {
        "fifo": "/r/c/n/console.fifo",
        "pid": 7,
    }


# --- postcopy ------------------------------------------------------------------------


def test_wait_says_whether_the_switch_to_postcopy_was_made() -> None:
    """The switch is asked once after the given passes, and the stats say it was made."""
    active = {"status": "active", "ram": {"dirty-sync-count": 2}}
    done = {"status": "completed", "ram": {"postcopy-requests": 41, "dirty-sync-count": 2}}
    replies = [active, {"status": "postcopy-active"}, done]
    asked: list[object] = []

    def qmp(*commands: m.Command) -> list[object]:
        asked.extend(commands)
        return [replies.pop(0) if c == "query-migrate" else {} for c in commands]

    s = m.wait(qmp, 30.0, postcopy_after_passes=2)
    assert asked.count("migrate-start-postcopy") == 1
    assert (s.postcopy, s.postcopy_requests) == (True, 41)
    replies[:] = [done]
    assert m.wait(qmp, 30.0, postcopy_after_passes=2).postcopy is False  # done before the switch


def test_postcopy_refused_for_an_unprivileged_qemu_unless_the_sysctl_allows(
    tmp_path: Path,
) -> None:
    from hpvc.host import userfaultfd

    sysctl = tmp_path / "proc/sys/vm/unprivileged_userfaultfd"
    sysctl.parent.mkdir(parents=True)
    sysctl.write_text("0\n")
    why = userfaultfd.postcopy_refusal(2113929216, tmp_path)
    assert why is not None and "vm.unprivileged_userfaultfd=1 (it is 0)" in why
    assert userfaultfd.postcopy_refusal(0, tmp_path) is None  # QEMU as root
    sysctl.write_text("1\n")
    assert userfaultfd.postcopy_refusal(2113929216, tmp_path) is None
    sysctl.unlink()
    assert "(it is unreadable)" in (userfaultfd.postcopy_refusal(5, tmp_path) or "")


KVM_ON, KVM_OFF = {"enabled": True, "present": True}, {"enabled": False, "present": True}


def _version(major: int, minor: int) -> dict[str, object]:
    return {"qemu": {"major": major, "minor": minor, "micro": 22}, "package": "x"}


def test_a_tcg_guest_on_qemu_before_9_is_copied_stopped() -> None:
    """TCG before QEMU 9.0 loses writes in a live copy; KVM and 9.0 on do not;
    an unreadable version counts as old."""
    assert m.live_copy_loses_writes(KVM_OFF, _version(7, 2))
    assert m.live_copy_loses_writes(KVM_OFF, _version(8, 2))
    assert m.live_copy_loses_writes(KVM_OFF, {})
    assert not m.live_copy_loses_writes(KVM_OFF, _version(9, 0))
    assert not m.live_copy_loses_writes(KVM_ON, _version(7, 2))


def _session(
    kvm: dict[str, object], replies: list[dict[str, object]], asked: list[object]
) -> m.Runner:
    def qmp(*commands: m.Command) -> list[object]:
        asked.extend(commands)
        out: list[object] = []
        for c in commands:
            if c == "query-kvm":
                out.append(kvm)
            elif c == "query-version":
                out.append(_version(7, 2))
            elif c == "query-migrate":
                out.append(replies.pop(0))
            else:
                out.append({})
        return out

    return qmp


def test_start_stops_a_tcg_guest_before_migrate_and_not_a_kvm_one() -> None:
    asked: list[object] = []
    assert m.start(_session(KVM_OFF, [], asked), "unix:/x") is True
    assert asked[-2:] == ["stop", ("migrate", {"uri": "unix:/x"})]
    asked.clear()
    assert m.start(_session(KVM_ON, [], asked), "unix:/x") is False
    assert "stop" not in asked and asked[-1] == ("migrate", {"uri": "unix:/x"})


def test_a_stopped_copy_reports_its_whole_time_as_the_pause_and_resumes_on_failure() -> None:
    done = {"status": "completed", "total-time": 640, "downtime": 4, "ram": {}}
    asked: list[object] = []
    s = m.wait(_session(KVM_OFF, [done], asked), 30.0, paused=True)
    assert (s.stop_and_copy, s.downtime_ms, s.total_ms) == (True, 640, 640)
    assert "cont" not in asked  # the target runs it now
    failed = {"status": "failed", "error-desc": "boom"}
    with pytest.raises(m.MigrationFailed) as e:
        m.wait(_session(KVM_OFF, [failed], asked), 30.0, paused=True)
    assert e.value.reason == "failed" and asked[-1] == "cont"
    asked.clear()
    with pytest.raises(m.MigrationFailed):
        m.wait(_session(KVM_ON, [failed], asked), 30.0)
    assert "cont" not in asked  # QEMU resumes a guest it stopped itself


REGION = "/dev/shm/hpvc-ivshmem-x7/3"


def test_the_region_a_qemu_maps_is_read_from_its_command_line() -> None:
    from hpvc.backends.qemu.region import region_of

    assert region_of(SRC) is None
    shm = [*SRC, "-object", f"memory-backend-file,id=ivshmem0,mem-path={REGION},size=64M,share=on"]
    assert region_of(shm) == REGION
    ram = ["-object", "memory-backend-file,id=mem0,mem-path=/dev/hugepages/hpvc,size=256M"]
    assert region_of(ram) is None  # guest RAM is not the region


def test_start_can_be_told_to_stop_a_kvm_guest_too() -> None:
    asked: list[object] = []
    assert m.start(_session(KVM_ON, [], asked), "unix:/x", stop=True) is True
    assert asked[-2:] == ["stop", ("migrate", {"uri": "unix:/x"})]

"""The pure parts of live migration (hpvc.backends.vm.migration): settings,
the QMP commands each side gets, and what a query-migrate reply says."""

from __future__ import annotations

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

"""The CLI's error lines: a permission problem is one line and exit 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.cli import main
from hpvc.cluster import listing


def test_permission_denied_is_one_line_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def denied(*_: object, **__: object) -> object:
        raise PermissionError(13, "Permission denied", "/var/lib/hpvc/state.lock")

    monkeypatch.setattr(listing, "list_clusters", denied)
    with pytest.raises(SystemExit) as e:
        main(["ls"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == "hpvc: ls: permission denied /var/lib/hpvc/state.lock (run as root)"


@pytest.mark.parametrize("n", ["0", "-1"])
def test_run_refuses_fewer_than_one_rank(
    n: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpvc.store import ClusterRecord, Store

    store = Store(tmp_path)
    store.save(ClusterRecord("c", {}, "c.toml", {}, "running", 0.0, 0.0))
    monkeypatch.setenv("HPVC_STATE_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as e:
        main(["run", "c", "-n", n, "--", "hostname"])
    assert e.value.code == 2
    assert f"hpvc: -n {n}: a job needs at least one rank" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (KeyboardInterrupt(), "interrupted (Ctrl-C)"),
        (SystemExit(143), "interrupted (signal 15)"),
        (SystemExit(0), "interrupted"),
        (RuntimeError("disk full"), "failed (disk full)"),
    ],
)
def test_an_up_that_stops_says_why(error: BaseException, said: str) -> None:
    from hpvc.cluster.lifecycle import stopped_by

    assert stopped_by(error) == said

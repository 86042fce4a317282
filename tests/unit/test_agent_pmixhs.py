"""native/agent/pmixhs.c: what the task relay lets through to Slurm's PMIx
server from a guest (docs/slurm.md, "MPI between guests"). The requests are
built here as PMIx 4.2's client builds them; the relay's check, run through
tests/native/agent_driver.c, must pass only this task's own request, with the
claimed uid and gid replaced by the relay's, and say why it refuses others."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tests.agent_driver import build

NS, RANK, UID, GID = "slurm.pmix.42.0", 3, 1234, 5678


def request(
    ns: str = NS, rank: int = RANK, sec: str = "native", kind: int = 0, cred: int = 8
) -> bytes:
    body = sec.encode() + b"\0" + struct.pack("!I", cred) + struct.pack("<II", 0, 0)[:cred]
    body += bytes([kind]) + ns.encode() + b"\0" + struct.pack("!I", rank)
    body += b"4.2.2\0v41\0" + bytes([2]) + b"hash\0"
    return struct.pack("<iIQ", -1, 0xFFFFFFFF, len(body)) + body


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None or shutil.which("make") is None:
        pytest.skip("gcc and make needed")
    return build(tmp_path_factory.mktemp("agent"))


def check(driver: Path, msg: bytes) -> tuple[int, str, bytes]:
    out = subprocess.run(
        [str(driver), "pmixhs", NS, str(RANK), str(UID), str(GID), msg.hex()],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()  # fmt: skip
    rc, why = out[0].split(" ", 1)
    return int(rc), why, bytes.fromhex(out[1]) if len(out) > 1 else b""


def test_the_tasks_own_request_passes_with_the_relays_ids(driver: Path) -> None:
    msg = request()
    rc, why, out = check(driver, msg)
    assert (rc, why) == (1, "-")
    at = msg.index(b"native\0") + 7 + 4  # the credential, after its length
    assert struct.unpack("<II", out[at : at + 8]) == (UID, GID)  # root's 0:0 no more
    assert out[:at] == msg[:at] and out[at + 8 :] == msg[at + 8 :]  # nothing else changed


@pytest.mark.parametrize("cut", [0, 10, 16, 30])
def test_a_request_not_whole_yet_waits(driver: Path, cut: int) -> None:
    assert check(driver, request()[:cut])[0] == 0


@pytest.mark.parametrize(
    ("msg", "why"),
    [
        (request(rank=RANK + 1), "another namespace or rank than this task's"),
        (request(ns="slurm.pmix.43.0"), "another namespace or rank than this task's"),
        (request(sec="none"), "only PMIx's native security is carried"),
        (request(sec="munge"), "only PMIx's native security is carried"),
        (request(kind=3), "only an MPI rank (a simple PMIx client) is carried"),
        (request(cred=4), "a malformed PMIx connection request"),
        (b"GET / HTTP/1.0\r\nHost: x\r\n\r\n", "not a PMIx connection request"),
        (request() + b"more", "the client sent more than its connection request"),
    ],
    ids=["rank", "namespace", "psec-none", "psec-munge", "tool", "cred", "http", "more"],
)
def test_anything_else_is_refused_with_its_reason(driver: Path, msg: bytes, why: str) -> None:
    rc, said, _ = check(driver, msg)
    assert rc == -1 and why in said, said

"""native/agent/auth.c's SHA-256 and HMAC agree with Python's (RFC 4231 vectors and more)."""

from __future__ import annotations

import hashlib
import hmac
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.agent_driver import build

# RFC 4231 test cases 1, 2, 3, 6 (a key longer than the block) and 7.
CASES = [
    (b"\x0b" * 20, b"Hi There"),
    (b"Jefe", b"what do ya want for nothing?"),
    (b"\xaa" * 20, b"\xdd" * 50),
    (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First"),
    (
        b"\xaa" * 131,
        b"This is a test using a larger than block-size key and a larger than"
        b" block-size data. The key needs to be hashed before being used by the"
        b" HMAC algorithm.",
    ),
    (b"k" * 32, b""),  # empty message
    (b"k" * 64, b"x" * 55),  # padding edges: 55, 56, 64 bytes after the pad block
    (b"k" * 32, b"x" * 56),
    (b"k" * 32, b"n" * 32 + b"hpvc-agent client"),  # what the agent checks
]


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None or shutil.which("make") is None:
        pytest.skip("gcc and make needed")
    return build(tmp_path_factory.mktemp("agent"))


@pytest.mark.parametrize("key,msg", CASES)
def test_hmac_matches_python(driver: Path, key: bytes, msg: bytes) -> None:
    for cut in sorted({0, len(msg) // 2, len(msg)}):  # a || b, split anywhere
        a, b = msg[:cut], msg[cut:]
        out = subprocess.run(
            [str(driver), "hmac", key.hex() or "-", a.hex() or "-", b.hex() or "-"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        assert out == hmac.new(key, msg, hashlib.sha256).hexdigest(), (key, cut)

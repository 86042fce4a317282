"""A slow, obvious Python gensort (binary records) to check hpvc's Java TeraGen against.

Written from the published layout (gensort 1.5 ``gen_rec``; Hadoop's
``GenSort.generateRecord``) and generator (gensort's rand16.c; Hadoop's
``Random16``: X' = A*X + C mod 2^128 from X = 0, record N uses the state after
N+1 steps), not from hpvc's Java code.
"""

from __future__ import annotations

import zlib

MOD = 1 << 128
A = 0x2360ED051FC65DA44385DF649FCCF645
C = 0x4A696D47726179524950202020202001


def skip_ahead(steps: int) -> int:
    """The generator's state ``steps`` steps after 0, by composing f^(2^i) (as rand16.c)."""
    x, a, c = 0, A, C
    while steps:
        if steps & 1:
            x = (a * x + c) % MOD
        a, c = (a * a) % MOD, (a * c + c) % MOD
        steps >>= 1
    return x


def record(row: int, rand: int) -> bytes:
    key = rand.to_bytes(16, "big")[:10]
    filler = b"".join(
        (b"%X" % ((rand >> (44 - 4 * i)) & 0xF)) * 4 for i in range(12)
    )  # 12 hex digits of the low 48 bits, each 4 times
    return key + b"\x00\x11" + b"%032X" % row + b"\x88\x99\xaa\xbb" + filler + b"\xcc\xdd\xee\xff"


def records(first: int, count: int) -> bytes:
    """Records ``first .. first+count-1``, as ``gensort -b FIRST COUNT`` writes them."""
    x = skip_ahead(first)
    out = bytearray()
    for row in range(first, first + count):
        x = (A * x + C) % MOD
        out += record(row, x)
    return bytes(out)


def checksum(data: bytes) -> int:
    """valsort's checksum: the sum of every 100-byte record's CRC32."""
    return sum(zlib.crc32(data[i : i + 100]) for i in range(0, len(data), 100))

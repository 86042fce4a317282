"""The shared region's allocator under libuct_ivshmem.so (native/ucx/region.c), on its own.

native/ucx/test_alloc.c runs each rule against real anonymous shared mappings and real
dead processes, and prints "ok NAME" / "not ok NAME: why"; this test builds it out of
the tree and wants every check named here to have run and passed, so a check that
silently stops running fails as well as one that fails.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECKS = [
    "first_use_sets_an_id",
    "second_attach_keeps_the_id",
    "two_regions_two_ids",
    "foreign_data_refused",
    "too_small_refused",
    "fills_up",
    "full_reported",
    "segments_apart",
    "free",
    "freed_id_refused",
    "double_free_refused",
    "reuse_changes_generation",
    "stale_id_refused_after_reuse",
    "all_back",
    "dead_owner_seen_until_reclaim",
    "dead_owner_refused",
    "dead_owner_quarantined",
    "dead_owner_freed_after_quarantine",
    "other_guest_not_judged",
    "zombie_owner_refused",
    "dead_lock_holder_broken",
    "members_join_apart",
    "left_member_reused",
    "member_table_fills",
    "departure_found",
    "departure_kept_at_first_use",
    "departing_guest_kept",
    "gone_guest_quarantined",
    "other_guest_kept",
    "gone_guest_freed",
    "gone_member_reused",
    "gone_member_segments_quarantined",
]


def build_test_alloc(out: Path) -> Path:
    """native/ucx/test_alloc built into ``out`` (no UCX needed)."""
    binary = out / "test_alloc"
    build = subprocess.run(
        ["make", "-s", "-C", str(ROOT / "native" / "ucx"), f"OUT={out}", str(binary)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    return binary


def test_region_allocator(tmp_path: Path) -> None:
    binary = build_test_alloc(tmp_path)
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120, check=False)
    lines = run.stdout.splitlines()
    assert lines == [f"ok {name}" for name in CHECKS], run.stdout + run.stderr
    assert run.returncode == 0

"""``hpvc bench images``: importing Docker/OCI images, against Podman, tar and umoci.

Two docker-archives are made first by Podman from this host's files
(``images.tools``: ``base`` from an hpvc image's root filesystem, default
``hpc``, about 300 MB; ``big``, base plus a layer of incompressible files,
default 700 MiB more). Every repetition then, for each archive (the order of
the archives and of the ways rotating between repetitions):

- ``hpvc``: ``hpvc image import NAME docker-archive:PATH``, the whole CLI as
  a user runs it, into a store that holds nothing (every imported image
  removed first with ``hpvc image rm``, untimed), and at once ``hpvc_again``:
  the same command a second time (the image is there: reused);
- ``podman_load``, ``tar``, ``skopeo_umoci``: the peers of ``images.tools``.

``sync`` runs, untimed, before every timed step. The hpvc side's image store
and state are in the run's temporary folder: the user's images are read (the
base's rootfs, the built image for ``up``), never changed.

Then, alternated, an N-node container cluster (default 8; 1 vCPU shared,
128 MiB each, as ``hpvc bench startup``) is brought up and down from the
imported ``base`` (``imported``) and from the hpvc image it came from
(``built``): the same files, one unpacked by the import, one built by hpvc.
Each is ``hpvc up SPEC --quiet`` and ``hpvc down NAME`` timed as processes.

Last, once, the disk: ``du`` of an image store holding base alone, big alone,
and both (``images.report`` says what is shared). Ratios and goals are
worked out by ``images.report``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.images import report, tools
from hpvc.bench.images.tools import Archive, Podman
from hpvc.bench.startup import cli_start
from hpvc.bench.startup.runner import groups, hpvc_argv
from hpvc.errors import HpvcError, InputError
from hpvc.image import resolve_image
from hpvc.paths import image_dir
from hpvc.progress import Progress, quiet
from hpvc.store import Store

WAYS = ("hpvc", *report.PEERS)
SIDES = report.SIDES


def preflight(repeat: int, nodes: int, extra_mib: int) -> None:
    if repeat < 1 or nodes < 1 or extra_mib < 1:
        raise InputError("bench images", "--repeat, --nodes and --extra-mib must be >= 1", "")
    common.require("bench images", [*tools.TOOLS, "crun", "ip"])


class Bench:
    """One run's folders, stores and commands."""

    def __init__(self, tmp: Path, store: Store, base: str) -> None:
        self.tmp = tmp
        self.state = store
        self.base = base
        self.images = tmp / "images"  # the imports' store
        self.scratch = tmp / "scratch"
        self.scratch.mkdir()

    def env(self, images: Path | None = None) -> dict[str, str]:
        return {
            **os.environ,
            "HPVC_STATE_DIR": str(self.state.root),
            "HPVC_IMAGE_DIR": str(images or self.images),
            "HPVC_RESIDENT": "0",
        }

    def hpvc(self, *args: str, images: Path | None = None) -> float:
        """Wall seconds of ``hpvc ARGS`` run as its own process."""
        return cli_start.timed([*hpvc_argv(), *args], self.env(images))

    def names(self, images: Path | None = None) -> list[str]:
        folder = (images or self.images) / "names"
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def clear(self, images: Path | None = None) -> None:
        for name in self.names(images):
            self.hpvc("image", "rm", name, images=images)

    def import_(self, a: Archive, images: Path | None = None) -> float:
        return self.hpvc("image", "import", a.label, f"docker-archive:{a.path}", images=images)


def trial(b: Bench, podman: Podman, a: Archive, way: str) -> dict[str, float]:
    """One way of getting archive ``a``'s files: {config: seconds}."""
    tools.sync()
    if way == "podman_load":
        return {way: podman.load(a.path, a.tag)}
    if way == "tar":
        return {way: tools.tar_unpack(a.path, b.scratch)}
    if way == "skopeo_umoci":
        return {way: tools.umoci_unpack(a.path, b.scratch)}
    b.clear()
    tools.sync()
    first = b.import_(a)
    tools.sync()
    return {"hpvc": first, "hpvc_again": b.import_(a)}


def rotate(items: tuple[Any, ...] | list[Any], rep: int) -> list[Any]:
    k = rep % len(items)
    return list(items[k:]) + list(items[:k])


def import_trials(
    b: Bench, podman: Podman, archives: list[Archive], rep: int, progress: Progress
) -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    for a in rotate(archives, rep):
        for way in rotate(WAYS, rep):
            for config, seconds in trial(b, podman, a, way).items():
                at = {"rep": rep, "order": len(samples), "image": a.label}
                samples.append({**at, "config": config, "seconds": seconds})
        got = ", ".join(
            f"{s['config']} {s['seconds']:.2f}" for s in samples if s["image"] == a.label
        )
        progress(f"repetition {rep + 1}: {a.label}: {got} s")
    return samples


def write_specs(b: Bench, nodes: int, built: str) -> dict[str, tuple[str, str, Path]]:
    """Per side: (cluster name, spec path, image store), each on a free /24."""
    out: dict[str, tuple[str, str, Path]] = {}
    images = {"built": (built, image_dir()), "imported": ("base", b.images)}
    for side, subnet in zip(SIDES, common.free_subnets(len(SIDES)), strict=True):
        name = f"bi{os.getpid() % 100000}{side[0]}"
        image, store = images[side]
        spec = common.cluster_spec(name, subnet, groups(nodes))
        spec = spec.replace('image = "hpc"', f'image = "{image}"')
        path = b.tmp / f"{name}.toml"
        path.write_text(spec)
        out[side] = (name, str(path), store)
    return out


def cluster_trials(
    b: Bench,
    specs: dict[str, tuple[str, str, Path]],
    base: Archive,
    rep: int,
    progress: Progress,
) -> list[dict[str, Any]]:
    if "base" not in b.names():
        b.import_(base)  # untimed: the cluster part needs it
    tools.sync()
    out: list[dict[str, Any]] = []
    for side in rotate(SIDES, rep):
        name, spec, images = specs[side]
        up = b.hpvc("up", spec, "--quiet", images=images)
        rec = b.state.get(name)
        down = b.hpvc("down", name, images=images)
        out.append(
            {
                "rep": rep,
                "order": len(out),
                "config": side,
                "up_s": up,
                "down_s": down,
                "up_inner_s": float(rec.up_seconds or 0.0),
            }
        )
    got = ", ".join(f"{r['config']} up {r['up_s']:.2f}" for r in out)
    progress(f"repetition {rep + 1}: cluster: {got} s")
    return out


def disk(b: Bench, archives: list[Archive]) -> dict[str, Any]:
    """``du`` of a fresh store with each image alone and with both."""
    out: dict[str, Any] = {}
    for a in archives:
        alone = b.tmp / f"disk-{a.label}"
        b.import_(a, images=alone)
        out[f"{a.label}_alone"] = parts(alone)
        b.clear(alone)
        shutil.rmtree(alone, ignore_errors=True)
    both = b.tmp / "disk-both"
    for a in archives:
        b.import_(a, images=both)
    out["both"] = parts(both)
    b.clear(both)
    shutil.rmtree(both, ignore_errors=True)
    return out


def parts(images: Path) -> dict[str, Any]:
    """Bytes on disk: the whole store, its shared blobs, and each image's folder."""
    by = images / "by-digest"
    folders = {}
    for name in sorted((images / "names").iterdir()):
        digest = name.read_text().strip()
        folders[name.name] = tools.du_bytes(by / digest)
    return {
        "store_bytes": tools.du_bytes(images),
        "blobs_bytes": tools.du_bytes(images / "blobs"),
        "image_folder_bytes": folders,
    }


def facts() -> dict[str, Any]:
    out = common.host_facts(mpi=False)
    for tool in ("podman", "skopeo", "umoci", "tar"):
        out[tool] = common.tool_version([tool, "--version"])
    return out


def run(
    repeat: int = 5,
    base: str = "hpc",
    extra_mib: int = 700,
    nodes: int = 8,
    progress: Progress = quiet,
) -> dict[str, Any]:
    """Make the archives, time imports and ``up``, measure the disk; the results."""
    preflight(repeat, nodes, extra_mib)
    common.ensure_image(base, progress)
    rootfs = resolve_image(base).rootfs
    about = facts()
    samples: list[dict[str, Any]] = []
    cluster: list[dict[str, Any]] = []
    tmp_root = Path(tempfile.mkdtemp(prefix="hpvc-bench-images-"))
    podman = Podman(tmp_root)
    try:
        progress(f"podman: making the archives from {rootfs} (+{extra_mib} MiB)")
        archives = tools.make_archives(podman, rootfs, extra_mib, f"hpvc-bench-{os.getpid()}")
        with common.scratch_state("bench images", progress) as (tmp, store):
            b = Bench(tmp, store, base)
            specs = write_specs(b, nodes, base)
            for rep in range(repeat):
                samples += import_trials(b, podman, archives, rep, progress)
                cluster += cluster_trials(b, specs, archives[0], rep, progress)
            progress("disk: stores with each image alone and with both")
            b.clear()
            used = disk(b, archives)
        made = [{"label": a.label, "layers": a.layers, "archive_bytes": a.size()} for a in archives]
    finally:
        errors = podman.close()
        shutil.rmtree(tmp_root, ignore_errors=True)
    if errors:
        raise HpvcError("bench images: podman cleanup", errors[0], f"look under {tmp_root}")
    about["loadavg_end"] = list(os.getloadavg())
    setup = {"base": base, "extra_mib": extra_mib, "nodes": nodes, "repeat": repeat}
    return report.document(about, setup, made, samples, cluster, used)

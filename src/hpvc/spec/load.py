"""Load a spec from TOML, turning every problem into a SpecError with a key path."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from hpvc.errors import SpecError
from hpvc.spec.limits import FIX_FILE, Limits, check_counts, disk_over, read_site
from hpvc.spec.model import Spec

_FIX = "see docs/spec.md"


def _key_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before"):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


def _first_error(path: str, err: ValidationError) -> SpecError:
    e = err.errors()[0]
    loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    key = _key_path(loc)
    msg = str(e["msg"]).removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        return SpecError(path, key, "unknown key", f"remove it or fix its spelling; {_FIX}")
    if e["type"] == "missing":
        return SpecError(path, key, "required key is missing", f"add it; {_FIX}")
    if e["type"] == "literal_error":
        return SpecError(path, key, f"got {e.get('input')!r}, {msg[:1].lower()}{msg[1:]}", _FIX)
    if (
        not key
        and ": " in msg
        and msg.split(": ", 1)[0]
        .replace(".", "")
        .replace("[", "")
        .replace("]", "")
        .replace("_", "")
        .isalnum()
    ):
        key, msg = msg.split(": ", 1)
    return SpecError(path, key, msg, _FIX)


def parse_spec(
    data: dict[str, Any],
    path: str = "<spec>",
    limits: Limits | Literal["site"] | None = None,
    fix: str = FIX_FILE,
) -> Spec:
    """The spec in ``data``. With ``limits`` (a site's caps, hpvc.spec.limits;
    "site": those of /etc/hpvc/limits.toml), a spec asking more nodes or groups
    is refused by arithmetic first, before the schema builds anything, and one
    asking more disk per node after it; ``fix`` says where the site raises
    them. Without, the schema's own ranges alone (a stored record, read back)."""
    if limits == "site":
        limits = read_site()
    if limits is not None:
        over = check_counts(data, limits)
        if over is not None:
            raise SpecError(path, over[0], over[1], fix)
    try:
        spec = Spec.model_validate(data)
    except ValidationError as err:
        raise _first_error(path, err) from None
    if limits is not None:
        for i, g in enumerate(spec.nodes):
            why = disk_over(g.disk, limits) if spec.kind == "container" else None
            if why is not None:
                raise SpecError(path, f"nodes[{i}].disk", why, fix)
    return spec


def load_spec(path: str | Path) -> Spec:
    return read_spec(path)[0]


def read_spec(path: str | Path, limits: Limits | None = None) -> tuple[Spec, dict[str, Any]]:
    """The spec at ``path`` and its TOML document as written (``scale`` edits the
    counts there), from one read of the file, held to ``limits`` (default: the
    site's, /etc/hpvc/limits.toml)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise SpecError(str(p), "", "file not found", "check the path") from None
    except IsADirectoryError:
        raise SpecError(
            str(p),
            "",
            "is a directory, not a spec file",
            "give the path of a cluster spec .toml file",
        ) from None
    except OSError as e:
        raise SpecError(str(p), "", f"cannot read: {e.strerror}", "check the permissions") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SpecError(str(p), "", "not UTF-8 text", "save the spec as UTF-8 TOML") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(str(p), "", f"not valid TOML: {e}", "fix the TOML syntax") from None
    return parse_spec(data, str(p), limits or "site"), data

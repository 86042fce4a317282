"""Load a spec from TOML, turning every problem into a SpecError with a key path."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hpvc.errors import SpecError
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
        return SpecError(path, key, f"got {e.get('input')!r}, {msg.lower()}", _FIX)
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


def parse_spec(data: dict[str, Any], path: str = "<spec>") -> Spec:
    try:
        return Spec.model_validate(data)
    except ValidationError as err:
        raise _first_error(path, err) from None


def load_spec(path: str | Path) -> Spec:
    return read_spec(path)[0]


def read_spec(path: str | Path) -> tuple[Spec, dict[str, Any]]:
    """The spec at ``path`` and its TOML document as written (``scale`` edits the
    counts there), from one read of the file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise SpecError(str(p), "", "file not found", "check the path") from None
    except OSError as e:
        raise SpecError(str(p), "", f"cannot read: {e.strerror}", "check the permissions") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SpecError(str(p), "", "not UTF-8 text", "save the spec as UTF-8 TOML") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(str(p), "", f"not valid TOML: {e}", "fix the TOML syntax") from None
    return parse_spec(data, str(p)), data

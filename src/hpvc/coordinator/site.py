"""The coordinator's site file: the shared disks, their bandwidth, the priorities.

An operator writes it (default ``/etc/hpvc/io.toml``; ``$HPVC_IO_SITE`` or a
command's ``--site`` names another); docs/io.md describes it::

    [devices.disk0]
    path = "/var/lib/hpvc"   # a path on the disk (its whole disk is meant), or
    # device = "254:0"       # the disk's major:minor
    write = "70MB/s"         # what to share out; a direction left out is not managed
    read = "200MB/s"

    [priority]
    default = 1              # clusters named nowhere below
    users = { alice = 4 }    # the owner of the cluster's spec file
    clusters = { big = 8 }   # a cluster by name (wins over its user)

Pure: ``parse_site`` checks a parsed document; ``load_site`` reads the file.
Every problem is one ``InputError`` (exit 2) naming the file and the key, so
nothing is changed by a bad file. Rates are bytes per second and take the
size notation (``70MB/s`` = 70,000,000, ``64MiB`` = 67,108,864).
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from hpvc.errors import InputError
from hpvc.units import parse_size

DEFAULT_PATH = Path("/etc/hpvc/io.toml")
ENV = "HPVC_IO_SITE"
FIX = "see docs/io.md"
MAX_PRIORITY = 1000
_DEVICE = re.compile(r"(\d{1,4}):(\d{1,7})")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _rate(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError("a rate must be a string such as '70MB/s' or '64MiB'")
    try:
        rate = parse_size(value)
    except ValueError as e:
        raise ValueError(str(e)) from None
    if rate < 1:
        raise ValueError(f"{value!r} is not a positive rate")
    return rate


Rate = Annotated[int, BeforeValidator(_rate)]
Priority = Annotated[int, Field(ge=1, le=MAX_PRIORITY)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Device(_Strict):
    """One shared disk: where it is and the bandwidth to share out on it."""

    path: str | None = None
    device: str | None = None
    read: Rate | None = None
    write: Rate | None = None

    @model_validator(mode="after")
    def _one_of(self) -> Device:
        if (self.path is None) == (self.device is None):
            raise ValueError("give either path (a folder on the disk) or device ('MAJ:MIN')")
        if self.device is not None and not _DEVICE.fullmatch(self.device):
            raise ValueError(f"device {self.device!r} is not 'MAJOR:MINOR' such as '254:0'")
        if self.path is not None and not self.path.startswith("/"):
            raise ValueError(f"path {self.path!r} is not absolute")
        if self.read is None and self.write is None:
            raise ValueError("give read, write or both: the bandwidth to share out")
        return self

    def numbers(self) -> tuple[int, int] | None:
        """(major, minor) when the device is named by number."""
        m = _DEVICE.fullmatch(self.device or "")
        return (int(m.group(1)), int(m.group(2))) if m else None

    def capacity(self, direction: str) -> int | None:
        return self.read if direction == "read" else self.write


class Priorities(_Strict):
    default: Priority = 1
    users: dict[str, Priority] = {}
    clusters: dict[str, Priority] = {}

    @model_validator(mode="after")
    def _names(self) -> Priorities:
        for table in ("users", "clusters"):
            for name in getattr(self, table):
                if not _NAME.fullmatch(name):
                    raise ValueError(f"{table}: {name!r} is not a user or cluster name")
        return self

    def of(self, cluster: str, owner: str | None) -> tuple[int, str]:
        """(priority, where it comes from) for ``cluster``, owned by ``owner``."""
        if cluster in self.clusters:
            return self.clusters[cluster], "site: cluster"
        if owner is not None and owner in self.users:
            return self.users[owner], f"site: user {owner}"
        return self.default, "site: default"


class Site(_Strict):
    devices: dict[str, Device] = Field(min_length=1)
    priority: Priorities = Priorities()

    @model_validator(mode="after")
    def _device_names(self) -> Site:
        for name in self.devices:
            if not _NAME.fullmatch(name):
                raise ValueError(f"devices: {name!r} is not a name such as 'disk0'")
        return self


def site_path(option: Path | None = None) -> tuple[Path, bool]:
    """(the site file, whether it was named): ``--site``, else ``$HPVC_IO_SITE``,
    else /etc/hpvc/io.toml (which may be absent: then nothing is managed)."""
    if option is not None:
        return option, True
    env = os.environ.get(ENV)
    return (Path(env), True) if env else (DEFAULT_PATH, False)


def _key(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc if not str(p).startswith("function-")]
    return ".".join(parts)


def parse_site(data: dict[str, Any], path: str = "<site>") -> Site:
    """A parsed site document as a ``Site``; InputError naming the key otherwise."""
    try:
        return Site.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        key = _key(tuple(e["loc"]))
        msg = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "required key is missing"
        where = f"site file {path}: {key}" if key else f"site file {path}"
        raise InputError(where, msg, FIX) from None


def load_site(option: Path | None = None) -> tuple[Path, Site | None]:
    """(path, site); site None when no site file was named and the default is
    absent (the coordinator then manages nothing). A named file that is
    missing, unreadable or wrong is an InputError."""
    path, named = site_path(option)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if not named:
            return path, None
        raise InputError(f"site file {path}", "file not found", f"check the path; {FIX}") from None
    except OSError as e:
        raise InputError(f"site file {path}", f"cannot read: {e.strerror}", FIX) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise InputError(f"site file {path}", f"not valid TOML: {e}", FIX) from None
    return path, parse_site(data, str(path))

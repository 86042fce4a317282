"""Help pages replayed: ``hpvc up --help`` shown again without importing typer.

Why: a help page is drawn by typer with rich (its help renderer imports
rich's tables, panels, columns and markdown), ~50 ms of imports on the
2-CPU machines of docs/benchmarks.md, most of a ``--help``'s whole run
(issue 33 item 4: every command within Python's own start + 0.06 s). What
it draws is a pure function of the words asked about, the hpvc and the
libraries installed, and the terminal it goes to; so the first time a page
is drawn its text is kept (per user, in ``$XDG_CACHE_HOME/hpvc/help`` or
``~/.cache/hpvc/help``), and the next identical request prints that text.

The key is everything the page can depend on: the argv; hpvc's package
(its path, how many modules and the newest one's modification time: an
edited command has a new page) and the site-packages folders (a library
installed or upgraded changes their listing); the output's encoding,
whether it is a terminal and the terminal's size (rich asks stdin, stdout
and stderr in that order); and the environment variables rich, typer and
hpvc read (colour, width, locale, ``HPVC_*``). A miss or any error reading or writing the cache runs
the command as before; ``HPVC_HELP_CACHE=0`` turns the cache off.

Only a request whose last word is ``--help`` or ``-h``, not the value of an
option before it (the word before starts with no ``-``) and with no ``--``,
is a help request here, and a page is kept only when the command exited 0
and printed a usage line: a command that ran instead of showing help is
never replayed. Standard library only, as ``hpvc.resident``: its cost is
part of every command's start.
"""

from __future__ import annotations

import os
import site
import sys
import zlib

TYPE_CHECKING = False  # typing is not imported: a replayed page needs none of it
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TextIO

HELP_WORDS = ("--help", "-h")
# Read by rich (colour, width, terminal), typer (its rich and terminal
# switches) and the locale (which characters draw the boxes).
ENV_NAMES = frozenset(
    (
        "COLUMNS", "LINES", "TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "PY_COLORS",
        "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS", "JUPYTER_LINES",
        "TERMINAL_WIDTH", "GITHUB_ACTIONS", "DATABRICKS_RUNTIME_VERSION", "LANG", "LANGUAGE",
    )
)  # fmt: skip
ENV_PREFIXES = ("TYPER_", "_TYPER_", "HPVC_", "LC_", "PYTHON")
USAGE = "Usage:"
KEEP = 200  # pages kept per user (a few KiB each)


def is_help(args: list[str]) -> bool:
    """Whether ``args`` asks for a help page (as this cache understands it)."""
    if not args or args[-1] not in HELP_WORDS or "--" in args:
        return False
    return len(args) == 1 or not args[-2].startswith("-")


def _terminal() -> str:
    for fd in (0, 1, 2):
        try:
            size = os.get_terminal_size(fd)
        except OSError:
            continue
        return f"{size.columns}x{size.lines}"
    return "none"


def _newest(folder: str) -> tuple[int, int]:
    """How many .py files under ``folder`` and the newest one's mtime (ns)."""
    count, newest = 0, 0
    with os.scandir(folder) as entries:
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                if e.name != "__pycache__":
                    n, m = _newest(e.path)
                    count, newest = count + n, max(newest, m)
            elif e.name.endswith(".py"):
                count, newest = count + 1, max(newest, e.stat().st_mtime_ns)
    return count, newest


def _code_marks() -> list[str]:
    """What draws the pages: hpvc's own modules (a help text or a default can
    come from any of them; ~1 ms to look at) and the site-packages folders."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    marks = []
    for where in (package, *site.getsitepackages()):
        try:
            mark = _newest(where) if where == package else os.stat(where).st_mtime_ns
        except OSError:
            continue
        marks.append(f"{where} {mark}")
    return marks


def key(args: list[str]) -> str:
    """The cache file's name for this request, as it would be drawn now."""
    out = sys.stdout
    env = sorted(
        f"{k}={v}" for k, v in os.environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)
    )
    parts = [
        sys.executable,
        *_code_marks(),
        f"{getattr(out, 'encoding', '')} {getattr(out, 'errors', '')}",
        f"tty={out.isatty()} {_terminal()}",
        *env,
        "\0".join(args),
    ]
    text = "\n".join(parts).encode("utf-8", "surrogateescape")
    return f"{zlib.crc32(text):08x}{zlib.adler32(text):08x}{len(text):x}"


def folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hpvc", "help")


def replay(args: list[str]) -> bool:
    """Print the kept page for ``args``; False when there is none (or no cache)."""
    if os.environ.get("HPVC_HELP_CACHE", "1") == "0":
        return False
    try:
        with open(os.path.join(folder(), key(args)), "rb") as f:
            page = f.read()
    except (OSError, ValueError):
        return False
    sys.stdout.write(page.decode("utf-8", "surrogateescape"))
    sys.stdout.flush()
    return True


class _Tee:
    """sys.stdout as it was, keeping a copy of what is written (rich and typer
    see the same stream: its isatty, encoding and descriptor)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        n = self._stream.write(text)  # click probes with bytes: TypeError, as from the stream
        self.parts.append(text)
        return n

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def recorded(args: list[str], run: Callable[[list[str]], None]) -> None:
    """Run ``run(args)`` (the command, here); a help page it printed, exiting 0,
    is kept for next time. Its exit passes through unchanged."""
    if os.environ.get("HPVC_HELP_CACHE", "1") == "0":
        run(args)
        return
    name = key(args)  # as it is now, before the command runs
    real = sys.stdout
    tee = _Tee(real)
    sys.stdout = tee
    try:
        run(args)
    except SystemExit as e:
        if e.code in (0, None):
            _keep(name, "".join(tee.parts))
        raise
    finally:
        sys.stdout = real
    _keep(name, "".join(tee.parts))


def _ours(path: str) -> bool:
    """Whether the nearest existing folder of ``path`` belongs to this user."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return os.stat(path).st_uid == os.geteuid()


def _keep(name: str, page: str) -> None:
    if USAGE not in page:
        return
    where = folder()
    try:
        if not _ours(where):
            return  # e.g. sudo keeping a user's HOME: root writes nothing into it
        os.makedirs(where, mode=0o700, exist_ok=True)
        tmp = os.path.join(where, f".{name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(page.encode("utf-8", "surrogateescape"))
        os.replace(tmp, os.path.join(where, name))
        _prune(where)
    except OSError:
        return  # a cache that cannot be written is no cache


def _prune(where: str) -> None:
    """Keep the newest ``KEEP`` pages: every edit or upgrade keys new ones."""
    with os.scandir(where) as entries:
        pages = [(e.stat().st_mtime_ns, e.path) for e in entries if e.is_file()]
    for _, path in sorted(pages)[:-KEEP]:
        try:
            os.unlink(path)
        except OSError:
            continue  # another hpvc removed it first

"""The ``hpvc`` command line. One module per command; parse, call, print.

The command tree lives in hpvc.cli.tree and is imported on first use: `hpvc
node ...`, which the Slurm plugin runs for every job, loads only its own
commands, not the benchmarks and their plotting.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = (
    False  # no typing module at start (~2 ms; hpvc.cli.helpcache replays help without it)
)
if TYPE_CHECKING:
    from typing import Any

# Nothing more is imported here: a command that runs on the resident hpvc
# (hpvc.resident) needs only the client, and its start is all it costs.

# When the CLI's own code began (after the interpreter's start and these few
# imports): `hpvc node up` tells the Slurm plugin how its time went from here.
STARTED = time.perf_counter()


def __getattr__(name: str) -> object:
    if name == "app":
        from hpvc.cli.tree import app

        return app
    raise AttributeError(name)


# Commands whose second word names the subcommand (``image rm``, ``node up``).
GROUPS = frozenset(("image", "node", "bench", "io", "spark"))


def command_words(args: list[str]) -> str:
    """The command as the user typed it, without its arguments: ``image rm``."""
    words = [a for a in args if not a.startswith("-")]
    if not words:
        return "hpvc"
    return " ".join(words[:2]) if words[0] in GROUPS and len(words) > 1 else words[0]


def main(argv: list[str] | None = None) -> None:
    """Entry point: the command runs on this host's resident hpvc when there is
    one (hpvc.resident: a warm fork, as the caller's user), else here."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:
        from hpvc import __version__

        print(f"hpvc {__version__}")
        return
    if argv is None:  # the command line, not a call from Python (tests, the server)
        from hpvc import resident
        from hpvc.cli import helpcache

        help_page = helpcache.is_help(args)
        if help_page and helpcache.replay(args):  # drawn before: no typer, no rich
            return
        code = resident.try_remote(args)
        if code is not None:
            sys.exit(code)
        if help_page:
            helpcache.recorded(args, run_here)
            return
    run_here(args)


def _invoke(app: Any, args: list[str], prog_name: str) -> None:
    """Run a Typer app, a command-line mistake as one line (``hpvc: render:
    Missing option '--out' (see hpvc render --help)``), exit 2; an exit code the
    command chose is passed on (SystemExit always, as Typer's standalone mode)."""
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
    from typer.exceptions import Abort

    from hpvc.cli.common import err_console

    try:
        rc = app(args=args, prog_name=prog_name, standalone_mode=False)
    except NoArgsIsHelpError:
        app(args=args, prog_name=prog_name)  # a group alone: its help, as Typer shows it
        return
    except UsageError as e:
        where = e.ctx.command_path if e.ctx is not None else prog_name
        words = where.removeprefix("hpvc").strip() or (args[0] if args else "hpvc")
        problem = " ".join(e.format_message().split()).rstrip(".")
        err_console.print(
            f"hpvc: {words}: {problem} (see {where} --help)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(e.exit_code)
    except ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except Abort:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    # As Typer's standalone mode: always SystemExit, 0 unless the command chose a code.
    sys.exit(rc if isinstance(rc, int) and not isinstance(rc, bool) else 0)


def run_here(args: list[str]) -> None:
    """Run the CLI in this process, turning HpvcError into one line and an exit code.

    Typer (standalone mode) reports usage errors itself with exit code 2 and
    lets every other exception through; ours become one line, no traceback.
    """
    from hpvc.cli.common import err_console, state
    from hpvc.errors import HpvcError

    try:
        if args[:1] in (["ls"], ["image"], ["node"], ["status"], ["plan"]):  # cli.quick
            from hpvc.cli import quick

            if quick.run(args):
                sys.exit(0)  # as typer's standalone mode ends
        if args[:1] == ["node"]:
            from hpvc.cli.node import node_app

            _invoke(node_app, args[1:], "hpvc node")
            return
        from hpvc.cli.tree import app

        _invoke(app, args, "hpvc")
    except HpvcError as e:
        if state.debug:
            raise
        err_console.print(f"hpvc: {e.line()}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except PermissionError as e:
        # A command that changes the host, run by a user who may not (hpvc's
        # state and the kernel objects it changes are root's): one line, exit 2.
        if state.debug:
            raise
        where = f" {e.filename}" if e.filename else ""
        why = "needs root: permission denied" if os.geteuid() != 0 else "permission denied"
        err_console.print(
            f"hpvc: {command_words(args)}: {why}{where} (run as root)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(2)

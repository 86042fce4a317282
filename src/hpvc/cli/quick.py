"""Without typer: ``hpvc ls``, ``image ls``, ``node ls``, ``status NAME``, ``plan SPEC``.

Why a hand-made dispatcher in front of typer: for these commands typer
itself is the cost. Importing it (and the click it vendors) and building
the command from its signature takes ~20 ms of the 2-CPU machines' ~0.1 s
``hpvc ls``, while reading the records and printing the table take less
(issue 33 item 4: every command within Python's own start + 0.06 s). Only
the exact forms below are taken here; any other word, a typo, ``--help``
or ``--debug`` goes to typer as before, so what typer would say about a
mistake is unchanged. The work itself is hpvc.cli.listings,
hpvc.cli.status_view and hpvc.cli.plan_view, which the typer commands call
too: both ways print the same.
"""

from __future__ import annotations

from pathlib import Path


def _image_ls(rest: list[str]) -> bool:
    """``image ls [--json] [--store DIR | --store=DIR]``, in any order."""
    as_json, store, i = False, None, 0
    while i < len(rest):
        word = rest[i]
        if word == "--json" and not as_json:
            as_json = True
        elif word == "--store" and store is None and i + 1 < len(rest):
            store, i = rest[i + 1], i + 1
        elif word.startswith("--store=") and store is None:
            store = word.removeprefix("--store=")
        else:
            return False
        i += 1
    if store is not None and (not store or store.startswith("-")):
        return False  # for typer to judge
    from hpvc.cli.listings import show_images

    show_images(Path(store) if store is not None else None, as_json)
    return True


def _status(rest: list[str]) -> bool:
    """``status NAME [--json]``, ``--json`` before or after NAME; a NAME that
    looks like an option (``-x``, ``--help``) is typer's to judge."""
    words = [w for w in rest if w != "--json"]
    if len(words) != 1 or len(rest) - len(words) > 1 or words[0].startswith("-"):
        return False
    from hpvc.cli.status_view import run_status

    run_status(words[0], as_json=len(rest) == 2)
    return True


def _plan(rest: list[str]) -> bool:
    """``plan SPEC [--json]``, ``--json`` before or after SPEC (the spec is read by
    its schema as before: hpvc.cli.plan_view); any other option is typer's."""
    words = [w for w in rest if w != "--json"]
    if len(words) != 1 or len(rest) - len(words) > 1 or words[0].startswith("-"):
        return False
    from hpvc.cli.plan_view import plan_and_show
    from hpvc.spec import load_spec

    plan_and_show(load_spec(words[0]), None, None, as_json=len(rest) == 2)
    return True


def run(args: list[str]) -> bool:
    """Run ``args`` here if it is one of the quick forms; False to leave it to typer."""
    if args in (["ls"], ["ls", "--json"]):
        from hpvc.cli.listings import show_clusters

        show_clusters(as_json=len(args) == 2)
        return True
    if args[:2] == ["image", "ls"]:
        return _image_ls(args[2:])
    if args[:1] == ["status"] and _status(args[1:]):
        return True
    if args[:1] == ["plan"] and _plan(args[1:]):
        return True
    if args in (["node", "ls"], ["node", "ls", "--json"]):
        from hpvc.cli.listings import show_shares

        show_shares(as_json=len(args) == 3)
        return True
    return False

"""README.md's code blocks, as tests/integration/test_readme.py runs them (issue 32).

A block is a fenced block (```) or an indented one (four spaces past the
paragraph or list item around it). What the test does with a block is said
by an HTML comment on the line before it (invisible on GitHub):

- none, or ``<!-- readme-test: run -->``: every command line is run, in order,
  in one shell for the whole README (so ``cd`` and ``export`` carry on), and
  must exit 0. ``run; "COMMAND" may exit N (why)`` allows exit N for that
  command, whose output must then be one error line ``hpvc: <what>: <why>
  (<fix>)``.
- ``<!-- readme-test: skip (why) -->``: not run; the why is required and says
  what covers it instead.
- ``<!-- readme-test: spec -->``: a cluster spec (TOML), planned with ``hpvc
  plan`` on a topology snapshot the README extracted before it.

A command's trailing comment with ``→`` shows its output: each of the
comma-separated pieces after the arrow must be in what it printed
(``hpvc run demo -- hostname  # → compute0, compute1``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

_MARKER = re.compile(r"^\s*<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
_LIST_ITEM = re.compile(r"^(\s*)(?:[-*+]|\d+[.)])\s+")
_MAY_EXIT = re.compile(r'"([^"]+)"\s+may exit (\d+)')
_COMMENT = re.compile(r"\s#\s?(.*)$")


@dataclass(frozen=True)
class Command:
    line: int  # 1-based line in the README
    text: str  # as a shell runs it, the trailing comment kept
    expect: tuple[str, ...] = ()  # pieces of the output shown after "→"
    may_exit: int | None = None


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the block's first line
    text: str  # the block, unindented
    action: str  # run | skip | spec
    reason: str = ""  # a skip's why
    may_exit: dict[str, int] = field(default_factory=dict)

    def commands(self) -> list[Command]:
        """The block's command lines (a trailing ``\\`` joins lines; comment lines drop)."""
        out: list[Command] = []
        pending: list[str] = []
        start = 0
        for i, raw in enumerate(self.text.splitlines()):
            s = raw.strip()
            if not pending and (not s or s.startswith("#")):
                continue
            if not pending:
                start = self.line + i
            pending.append(s)
            if s.endswith("\\"):
                continue
            text = "\n".join(pending)
            pending = []
            out.append(self._command(start, text))
        return out

    def _command(self, line: int, text: str) -> Command:
        expect: tuple[str, ...] = ()
        m = _COMMENT.search(text)
        if m and "→" in m.group(1):
            shown = m.group(1).split("→", 1)[1]
            expect = tuple(p.strip() for p in shown.split(",") if p.strip())
        bare = _COMMENT.sub("", text).strip()
        may = next((n for c, n in self.may_exit.items() if bare == c), None)
        return Command(line, text, expect, may)


def _indent(s: str) -> int:
    return len(s) - len(s.lstrip(" "))


def _marker(text: str, line: int) -> tuple[str, str, dict[str, int]]:
    if text == "" or text == "run" or text.startswith("run;"):
        return "run", "", {c: int(n) for c, n in _MAY_EXIT.findall(text)}
    if text == "spec":
        return "spec", "", {}
    m = re.fullmatch(r"skip \((.+)\)", text, re.S)
    if m:
        return "skip", m.group(1), {}
    raise ValueError(f"README.md:{line}: unknown readme-test marker {text!r}")


def blocks(markdown: str) -> list[Block]:
    """Every code block of ``markdown``, in order, with what the test does with it."""
    lines = markdown.splitlines()
    out: list[Block] = []
    content = 0  # where the text of the paragraph or list item around us starts
    marker: tuple[str, int] | None = None
    prev_blank = True
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.lstrip().startswith("```"):
            fence = ln.lstrip()[:3]
            j = i + 1
            while j < len(lines) and not lines[j].lstrip().startswith(fence):
                j += 1
            body = "\n".join(x[_indent(ln) :] for x in lines[i + 1 : j])
            out.append(_block(i + 2, body, marker))
            marker, prev_blank, i = None, False, j + 1
            continue
        if not ln.strip():
            prev_blank, i = True, i + 1
            continue
        if prev_blank and _indent(ln) >= content + 4:
            at = _indent(ln)
            j = i
            while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) >= at):
                j += 1
            while not lines[j - 1].strip():
                j -= 1
            body = "\n".join(x[at:] for x in lines[i:j])
            out.append(_block(i + 1, body, marker))
            marker, prev_blank, i = None, False, j
            continue
        m = _MARKER.match(ln)
        if m:
            marker = (m.group(1), i + 1)
        else:
            marker = None
            item = _LIST_ITEM.match(ln)
            content = len(item.group(0)) if item else _indent(ln)
        prev_blank, i = False, i + 1
    return out


def _block(line: int, body: str, marker: tuple[str, int] | None) -> Block:
    action, reason, may = _marker(*marker) if marker else ("run", "", {})
    return Block(line, body, action, reason, may)

"""Layout checks over the C under native/ (the C side of test_layering.py's rule d).

a. a file past 400 lines says in its leading comment why ("Long because ...");
b. no function body is longer than 80 lines;
c. the agent's sources are built by native/agent's Makefile alone, and every
   Makefile that builds hpvc's own C code asks for the SPANK plugin's warnings.

Function bodies are found roughly, which the code's one style (Linux kernel
style: a definition starts at column 0, its "{" alone on a line at column 0
or ending the definition's line, its "}" alone at column 0) makes enough.
Each check is a function from source text to ``Hit``s; the self-tests at the
end feed it good and bad snippets, so a check cannot pass by seeing nothing.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
LONG_LINES = 400
LONG_REASON = "Long because"
LONG_BODY = 80


@dataclass(frozen=True)
class Hit:
    line: int
    what: str


@dataclass(frozen=True)
class Function:
    name: str
    line: int  # where its definition starts (1-based)
    body: int  # lines between its braces


def c_files() -> list[Path]:
    return sorted(p for p in NATIVE.rglob("*") if p.suffix in (".c", ".h") and p.is_file())


def report(title: str, found: Iterable[str]) -> str:
    return "\n  ".join([title, *found])


# --- a. long files say why ----------------------------------------------------------------


def leading_comment(source: str) -> str:
    """The comment the file starts with: one /* ... */ block, or a run of // lines."""
    text = source.lstrip()
    if text.startswith("/*"):
        end = text.find("*/")
        return text if end < 0 else text[: end + 2]
    lines = []
    for line in text.splitlines():
        if not line.startswith("//"):
            break
        lines.append(line)
    return "\n".join(lines)


def unexplained_length(source: str, limit: int = LONG_LINES) -> list[Hit]:
    lines = len(source.splitlines())
    if lines <= limit or LONG_REASON in leading_comment(source):
        return []
    return [Hit(1, f"{lines} lines, no {LONG_REASON!r} in the leading comment")]


# --- b. long functions --------------------------------------------------------------------

_ATTRIBUTE = re.compile(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)")
_NAME = re.compile(r"(\w+)\s*\(")


def _header_start(line: str) -> bool:
    """Could a definition start here: column 0, a word first, a "(" before any "="?"""
    if not re.match(r"[A-Za-z_]", line) or "(" not in line:
        return False
    return "=" not in line.split("(", 1)[0]


def functions(source: str) -> Iterator[Function]:
    """Every function definition: a header at column 0 (continued on indented
    lines), then "{" ending it or alone on the next line; the body runs to the
    next "}" at column 0 (to the end of the text when there is none). A header
    ending in ";" is a declaration; one whose next line is at column 0 and no
    "{" (a one-line function, a macro use) is skipped."""
    lines = source.splitlines()
    i = 0
    while i < len(lines):
        if not _header_start(lines[i]):
            i += 1
            continue
        brace, i = _opening_brace(lines, i)
        if brace is None:
            continue
        end = brace + 1
        while end < len(lines) and not lines[end].startswith("}"):
            end += 1
        header = _ATTRIBUTE.sub("", " ".join(lines[i : brace + 1]))
        found = _NAME.search(header)
        yield Function(found.group(1) if found else "?", i + 1, end - brace - 1)
        i = end + 1


def _opening_brace(lines: list[str], start: int) -> tuple[int | None, int]:
    """(the line of the "{" that opens the body of the header at ``start``, start),
    or (None, where to look on) when the header opens no body."""
    for k in range(start, len(lines)):
        text = lines[k].rstrip()
        if k > start and text != "{" and not text[:1].isspace():
            return None, k  # a new line at column 0: it may start a header itself
        if text.endswith(";"):
            return None, k + 1
        if text.endswith("{"):
            return k, start
    return None, len(lines)


def long_functions(source: str, limit: int = LONG_BODY) -> list[Hit]:
    return [Hit(f.line, f"{f.name}: {f.body} lines") for f in functions(source) if f.body > limit]


# --- c. one build of the agent, one set of warnings ----------------------------------------


def makefile_warnings(text: str) -> list[str]:
    """The flags of the Makefile's ``WARN :=`` line (continuations joined)."""
    joined = text.replace("\\\n", " ")
    found = re.search(r"^WARN\s*:?=(.*)$", joined, re.MULTILINE)
    return found.group(1).split() if found else []


def compiled_agent_sources(text: str) -> list[str]:
    """Agent .c files a Makefile names (it should link native/agent's archive instead)."""
    return re.findall(r"(?:\.\./agent|\$\(AGENT\))/\w+\.c", text)


# --- the checks over native/ --------------------------------------------------------------


def violations(check: Callable[[str], list[Hit]]) -> list[str]:
    found = []
    for path in c_files():
        for hit in check(path.read_text(encoding="utf-8")):
            found.append(f"{path.relative_to(ROOT)}:{hit.line} {hit.what}")
    return found


def test_the_walk_sees_the_c_code() -> None:
    """Guard for the checks below: they see the real files and their functions."""
    names = {p.relative_to(NATIVE).as_posix() for p in c_files()}
    assert {"agent/server.c", "agent/agent.h", "spank/run.c", "guest/init.c"} <= names
    found = {f.name: f for f in functions((NATIVE / "agent" / "server.c").read_text())}
    assert {"handle", "hpvc_agent_start", "read_command", "finish", "say"} <= set(found)
    run = {f.name for f in functions((NATIVE / "spank" / "run.c").read_text())}
    assert {"hpvc_run", "hpvc_now", "child_env"} <= run
    total = sum(len(list(functions(p.read_text()))) for p in c_files())
    assert total > 150


def test_long_c_files_say_why() -> None:
    found = violations(unexplained_length)
    assert not found, report(
        f"C files over {LONG_LINES} lines: split them, or say in the leading comment "
        f"why not ({LONG_REASON} ...):",
        found,
    )


def test_no_c_function_is_long() -> None:
    found = violations(long_functions)
    assert not found, report(
        f"C functions over {LONG_BODY} lines: split them into functions that do one thing:",
        found,
    )


def test_the_agent_is_built_by_its_own_makefile_with_the_plugins_warnings() -> None:
    spank = (NATIVE / "spank" / "Makefile").read_text()
    warnings = makefile_warnings(spank)
    assert {"-Wall", "-Wextra", "-Werror"} <= set(warnings)
    for part in ("agent", "guest"):
        text = (NATIVE / part / "Makefile").read_text()
        assert makefile_warnings(text) == warnings, f"native/{part}/Makefile"
    for part in ("spank", "guest"):
        text = (NATIVE / part / "Makefile").read_text()
        assert compiled_agent_sources(text) == [], f"native/{part}/Makefile"
        assert "libhpvc-agent.a" in text and "-C $(AGENT)" in text, f"native/{part}/Makefile"


def test_make_builds_the_agent_out_of_its_tree(tmp_path: Path) -> None:
    """`make -C native/agent OUT=...` builds its archive and hpvc-rsh there,
    without a warning (-Werror) and without writing beside the sources."""
    before = sorted(p.name for p in (NATIVE / "agent").iterdir())
    done = subprocess.run(
        ["make", "-s", "-C", str(NATIVE / "agent"), f"OUT={tmp_path}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and done.stdout == ""
    members = subprocess.run(
        ["ar", "t", str(tmp_path / "libhpvc-agent.a")], capture_output=True, text=True, check=True
    ).stdout.split()
    objs = ["frames.o", "auth.o", "client.o", "server.o", "tty.o", "pty.o", "chan.o", "pmixhs.o"]
    assert members == objs
    assert (tmp_path / "hpvc-rsh").is_file()
    assert sorted(p.name for p in (NATIVE / "agent").iterdir()) == before


# --- self-tests: each detector fires on a bad snippet and stays quiet on a good one -------


def body(n: int) -> str:
    return "".join(f"\tx += {i};\n" for i in range(n))


def test_unexplained_length() -> None:
    lines = "int x;\n" * LONG_LINES
    assert unexplained_length("/* Short. */\n" + lines) == [
        Hit(1, f"{LONG_LINES + 1} lines, no 'Long because' in the leading comment")
    ]
    # The reason belongs to the leading comment, not to any comment further on.
    assert unexplained_length("/* Short. */\n/* Long because x. */\n" + lines) != []
    assert unexplained_length("/* Tool.\n *\n * Long because x.\n */\n" + lines) == []
    assert unexplained_length("\n// Tool.\n// Long because x.\n" + lines) == []
    assert unexplained_length("/* Short. */\n" + "int x;\n" * (LONG_LINES - 1)) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # kernel style: "{" alone on the line after the header
        ("static int f(void)\n{\n" + body(3) + "}\n", [Function("f", 1, 3)]),
        # a header on several lines, an attribute before the name
        (
            "static void __attribute__((noreturn)) g(int a,\n\t\tint b)\n{\n" + body(2) + "}\n",
            [Function("g", 1, 2)],
        ),
        # "{" ending the header's line
        ("int main(void) {\n" + body(4) + "}\n", [Function("main", 1, 4)]),
        # declarations, one-line functions, initializers and structs are no bodies
        (
            "int f(int a);\nint h(int a,\n\t  int b);\n"
            "static void on(int s) { (void)s; }\n"
            "static const int t[] = {\n\t1,\n};\n"
            "struct s {\n\tint (*cb)(int);\n};\n"
            "int k(void)\n{\n" + body(1) + "}\n",
            [Function("k", 11, 1)],
        ),
        # a nested block's "}" is indented: the body ends at column 0's
        (
            "int f(void)\n{\n\tif (x) {\n\t\ty();\n\t}\n}\nint g(void)\n{\n}\n",
            [Function("f", 1, 3), Function("g", 7, 0)],
        ),
    ],
)
def test_functions_are_found(source: str, expected: list[Function]) -> None:
    assert list(functions(source)) == expected


def test_long_functions() -> None:
    long = "static int f(void)\n{\n" + body(LONG_BODY + 1) + "}\n"
    assert long_functions(long) == [Hit(1, f"f: {LONG_BODY + 1} lines")]
    assert long_functions("int f(void)\n{\n" + body(LONG_BODY) + "}\n") == []
    # A body without a "}" at column 0 runs to the end: it is not missed.
    assert long_functions("int f(void)\n{\n" + body(LONG_BODY + 1) + "  }\n") != []


def test_makefile_checks() -> None:
    text = "CC ?= cc\nWARN := -Wall \\\n\t-Werror\nSRC := a.c ../agent/client.c $(AGENT)/frames.c\n"
    assert makefile_warnings(text) == ["-Wall", "-Werror"]
    assert makefile_warnings("CFLAGS = -O2\n") == []
    assert compiled_agent_sources(text) == ["../agent/client.c", "$(AGENT)/frames.c"]
    assert compiled_agent_sources("LIB := $(OBJ)/libhpvc-agent.a\n$(AGENT)/agent.h\n") == []


def test_a_report_lists_file_and_line() -> None:
    assert report("title", ["a:1 x", "b:2 y"]) == "title\n  a:1 x\n  b:2 y"

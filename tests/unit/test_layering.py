"""Architecture checks over src/hpvc, read with ``ast`` (nothing of hpvc is imported).

docs/architecture.md's pipeline only holds while the code keeps its shape:

a. the pure layers (plan, render, spec, topology) import nothing with side
   effects (host, backends, cluster, cli), not even inside a function;
b. only host/ and topology/ read the machine's /proc and /sys (architecture rule 2:
   everything else takes a root);
c. cluster/ and slurm/ never branch on the node kind or the backend, and host/
   never on a node kind or a backend's name (it does tell link kinds and
   journal kinds apart): that knowledge lives behind the one Backend protocol
   (architecture rule 3);
d. a module past 400 lines says in its docstring why ("Long because ...");
e. the packages import each other without a cycle (cluster -> backends -> host,
   the pure layers below everything that acts), counting imports inside
   functions and under TYPE_CHECKING: a cycle is a cycle;
f. bench/, slurm/ and cli/ reach backends/ and host/ through cluster/, except
   host/'s read-only readers (``READ_ONLY_HOST``), which change nothing: no
   journal, no undo, no write, no command (architecture rule 2);
g. the test beds (testbed/) stand on host/ and plan/ only, and only bench/
   uses them: nothing of the product does.

Each check is a function from source text to ``Hit``s; the self-tests at the
end feed it good and bad snippets, so a check cannot pass by seeing nothing.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "hpvc"

PURE_LAYERS = ("plan", "render", "spec", "topology")
SIDE_EFFECTS = ("hpvc.host", "hpvc.backends", "hpvc.cluster", "hpvc.cli")
MAY_READ_HOST = ("host", "topology")
LONG_LINES = 400
LONG_REASON = "Long because"


@dataclass(frozen=True)
class Hit:
    line: int
    what: str


@dataclass(frozen=True)
class Module:
    path: Path
    name: str  # dotted: hpvc.plan.place
    source: str

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"

    @property
    def layer(self) -> str:  # "plan" for hpvc/plan/..., "" for hpvc/errors.py
        parts = self.path.relative_to(PKG).parts
        return parts[0] if len(parts) > 1 else ""

    def where(self, hit: Hit) -> str:
        return f"{self.path.relative_to(ROOT)}:{hit.line} {hit.what}"


def modules() -> list[Module]:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        found.append(Module(path, ".".join(parts), path.read_text(encoding="utf-8")))
    return found


def report(title: str, found: Iterable[str]) -> str:
    return "\n  ".join([title, *found])


# --- a. imports of the pure layers ------------------------------------------------------


def _called(node: ast.Call) -> str:
    """``f`` of ``f(...)`` and of ``x.y.f(...)``."""
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join([*parts, name] if name else parts)


def imported(source: str, module: str, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import, anywhere in the module: import
    statements at any depth, and ``importlib.import_module``/``__import__`` of a literal.
    ``from A import b`` yields both ``A`` and ``A.b`` (b may be a submodule)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.level, node.module)
            yield node.lineno, base
            for alias in node.names:
                if alias.name != "*":
                    yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and _called(node) in ("import_module", "__import__"):
            name = _literal(node.args[0]) if node.args else None
            if name is not None:
                yield node.lineno, name


def forbidden_imports(
    source: str, module: str, is_package: bool = False, forbidden: Iterable[str] = SIDE_EFFECTS
) -> list[Hit]:
    hits: dict[int, str] = {}
    for line, name in imported(source, module, is_package):
        if any(_under(name, f) for f in forbidden) and line not in hits:
            hits[line] = f"imports {name}"
    return [Hit(line, what) for line, what in sorted(hits.items())]


# --- b. /proc and /sys outside host/ and topology/ --------------------------------------

_HOST_PATH = re.compile(r"^/(proc|sys)(/|$)")
_HOST_DIR = re.compile(r"^(proc|sys)(/|$)")
# Calls whose first argument is a path they open, list or look at.
_FILE_CALLS = frozenset(
    {
        "open", "Path", "PurePath", "PosixPath", "PurePosixPath",
        "listdir", "scandir", "walk", "stat", "lstat", "access", "readlink", "realpath",
        "exists", "isdir", "isfile", "islink", "glob", "iglob", "FileIO",
    }
)  # fmt: skip
_PATH_KEYWORDS = ("file", "path", "name")


def _host_path(node: ast.AST | None) -> str | None:
    """The literal text of ``node`` when it is a /proc or /sys path (str, f-string, "+")."""
    if node is None:
        return None
    if (text := _literal(node)) is not None:
        return text if _HOST_PATH.match(text) else None
    if isinstance(node, ast.JoinedStr) and node.values:
        head = _literal(node.values[0]) or ""
        return ast.unparse(node) if _HOST_PATH.match(head) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _host_path(node.left)
    return None


def _is_slash(node: ast.AST) -> bool:
    """``"/"`` or ``Path("/")``."""
    if isinstance(node, ast.Call) and _called(node) in _FILE_CALLS and node.args:
        node = node.args[0]
    return _literal(node) == "/"


def _host_dir(node: ast.AST) -> bool:
    """``"proc"``, ``"sys/fs"``: a path below "/" that leads into /proc or /sys."""
    return bool(_HOST_DIR.match(_literal(node) or ""))


def host_path_opens(source: str) -> list[Hit]:
    """Where a module opens or looks at /proc or /sys of the machine it runs on.

    A path string that is only data (a list of paths to mask in a container, a
    mount destination, a shell snippet) is not an open; a module-level constant
    that is nothing but such a path (``PROC = "/proc"``) is treated as one.
    """
    tree = ast.parse(source)
    hits: list[Hit] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called(node) in _FILE_CALLS:
            args = [*node.args[:1], *(k.value for k in node.keywords if k.arg in _PATH_KEYWORDS)]
            for arg in args:
                if (text := _host_path(arg)) is not None:
                    hits.append(Hit(node.lineno, f"{_called(node)}({text!r})"))
        elif isinstance(node, ast.Call) and _called(node) == "join" and len(node.args) > 1:
            if _is_slash(node.args[0]) and _host_dir(node.args[1]):  # os.path.join("/", "sys")
                hits.append(Hit(node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Div)
            and _is_slash(node.left)
            and _host_dir(node.right)
        ):  # Path("/") / "proc"
            hits.append(Hit(node.lineno, ast.unparse(node)))
    for stmt in tree.body:  # PROC = "/proc", SYS: str = "/sys"
        if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            value: ast.expr | None = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            value = stmt.value
        else:
            continue
        if (text := _host_path(value)) is not None:
            hits.append(Hit(stmt.lineno, f"module constant {text!r}"))
    return sorted(set(hits), key=lambda h: (h.line, h.what))


# --- c. kind/backend branches in cluster/, slurm/ and host/ ----------------------------

_SELECTORS = ("kind", "backend")
_KIND_LITERALS = frozenset(
    {"vm", "container", "libvirt", "qemu", "crun", "vm_qemu", "vm_libvirt", "vm-qemu", "vm-libvirt"}
)


def _is_selector_name(name: str) -> bool:
    return any(name == s or name.endswith("_" + s) for s in _SELECTORS)


def _selector(node: ast.AST) -> bool:
    """``kind``, ``plan.kind``, ``spec.node_backend``, ``rec.get("kind")``, ``d["backend"]``."""
    if isinstance(node, ast.Name):
        return _is_selector_name(node.id)
    if isinstance(node, ast.Attribute):
        return _is_selector_name(node.attr)
    if isinstance(node, ast.Call) and _called(node) == "get" and node.args:
        return _literal(node.args[0]) in _SELECTORS
    if isinstance(node, ast.Subscript):
        return _literal(node.slice) in _SELECTORS
    return False


def _strings(node: ast.AST) -> list[str]:
    """String literals: one, or those of a literal tuple/list/set."""
    if (text := _literal(node)) is not None:
        return [text]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for el in node.elts for s in _strings(el)]
    return []


def _pattern_strings(pattern: ast.pattern) -> list[str]:
    """The string literals a ``case`` pattern matches (``case "vm" | "container":``)."""
    values = (_literal(p.value) for p in ast.walk(pattern) if isinstance(p, ast.MatchValue))
    return [v for v in values if v is not None]


def registered_backends(source: str) -> frozenset[str]:
    """The names in the ``BACKENDS`` table of backends/registry.py's ``source``."""
    for stmt in ast.parse(source).body:
        target = stmt.target if isinstance(stmt, ast.AnnAssign) else None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
        value = getattr(stmt, "value", None)
        if isinstance(target, ast.Name) and target.id == "BACKENDS" and isinstance(value, ast.Dict):
            return frozenset(s for k in value.keys if k is not None for s in _strings(k))
    return frozenset()


def kind_branches(
    source: str, kinds: frozenset[str] = _KIND_LITERALS, any_literal: bool = True
) -> list[Hit]:
    """Comparisons (in an ``if``, a ternary, a ``while``, anywhere) and ``match``
    statements that tell node kinds or backends apart: those naming one of
    ``kinds`` (a node kind or a backend's name) and, with ``any_literal``, a kind
    or backend selector (``plan.kind``, ``spec.backend``) against any literal.
    Without it (host/, which tells link kinds and journal kinds apart) only
    ``kinds`` count."""
    hits: list[Hit] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            literals = [s for op in operands for s in _strings(op)]
            by_selector = any_literal and any(_selector(op) for op in operands) and literals
            if by_selector or kinds.intersection(literals):
                hits.append(Hit(node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Match):
            literals = [s for case in node.cases for s in _pattern_strings(case.pattern)]
            by_selector = any_literal and _selector(node.subject) and literals
            if by_selector or kinds.intersection(literals):
                hits.append(Hit(node.lineno, f"match {ast.unparse(node.subject)}: {literals}"))
    return sorted(set(hits), key=lambda h: (h.line, h.what))


# --- d. long modules say why --------------------------------------------------------------


def unexplained_length(source: str, limit: int = LONG_LINES) -> list[Hit]:
    lines = len(source.splitlines())
    if lines <= limit or LONG_REASON in (ast.get_docstring(ast.parse(source)) or ""):
        return []
    return [Hit(1, f"{lines} lines, no {LONG_REASON!r} in the module docstring")]


# --- e. no cycle between packages ---------------------------------------------------------


def unit_of(name: str) -> str | None:
    """The package (``cluster`` for hpvc.cluster.ops) or top-level module
    (``errors``) a module name belongs to; None outside hpvc and for ``hpvc`` itself."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "hpvc" else None


def package_graph(mods: Iterable[Module]) -> dict[str, dict[str, str]]:
    """unit -> {imported unit: where the first such import is (``file:line``)}."""
    graph: dict[str, dict[str, str]] = {}
    for m in mods:
        src = unit_of(m.name)
        if src is None:
            continue
        edges = graph.setdefault(src, {})
        for line, name in imported(m.source, m.name, m.is_package):
            dst = unit_of(name)
            if dst is not None and dst != src and dst not in edges:
                edges[dst] = f"{m.path.name}:{line}"
    return graph


def cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def cycle_report(graph: dict[str, dict[str, str]], comp: list[str]) -> list[str]:
    """Every import that stays inside one cycle, so the upward one is easy to spot."""
    return [f"{a} -> {b} ({graph[a][b]})" for a in comp for b in sorted(graph[a]) if b in comp]


# --- f. below the cluster API: only the read-only host readers ---------------------------

BELOW_THE_CLUSTER_API = ("hpvc.host", "hpvc.backends")
# Host-wide questions that change nothing (hardware facts, CPU time, the accelerator, the
# fabric's addresses, doctor's checks): bench/, slurm/ and cli/ ask these directly.
READ_ONLY_HOST = (
    "hpvc.host.accel",
    "hpvc.host.doctor",
    "hpvc.host.fabric",
    "hpvc.host.hwinfo",
    "hpvc.host.probe",
    "hpvc.host.usage",
)


def below_the_cluster_api(
    source: str, module: str, is_package: bool = False, allowed: Iterable[str] = READ_ONLY_HOST
) -> list[Hit]:
    """Imports of hpvc.host or hpvc.backends modules other than the ``allowed`` readers
    (``hpvc.host`` itself, the package, imports nothing; ``from hpvc.host import x``
    is judged by ``hpvc.host.x``)."""
    allowed = tuple(allowed)
    hits: dict[int, str] = {}
    for line, name in imported(source, module, is_package):
        if name == "hpvc.host" or any(_under(name, a) for a in allowed):
            continue
        if any(_under(name, b) for b in BELOW_THE_CLUSTER_API) and line not in hits:
            hits[line] = f"imports {name}"
    return [Hit(line, what) for line, what in sorted(hits.items())]


# Calls that change the host: files, mounts, commands, and the journal's own record.
_WRITES = frozenset(
    {
        "write_text", "write_bytes", "mkdir", "makedirs", "unlink", "rmdir", "rmtree",
        "chmod", "chown", "symlink", "rename", "mount", "umount", "record", "undoer",
        "run", "Popen", "call", "check_call", "check_output", "system", "execvp",
    }
)  # fmt: skip


def _write_mode(node: ast.Call) -> bool:
    """``open(path, "w")`` and the like: a mode that writes, appends or creates."""
    mode = node.args[1] if len(node.args) > 1 else None
    mode = next((k.value for k in node.keywords if k.arg == "mode"), mode)
    text = _literal(mode) if mode is not None else None
    return text is not None and any(c in text for c in "wax+")


def host_writes(source: str, module: str) -> list[Hit]:
    """What makes a module more than a reader: the journal imported, an undo registered,
    a call that writes, mounts or runs a command, a file opened for writing."""
    hits: dict[int, str] = {}
    for line, name in imported(source, module):
        if _under(name, "hpvc.host.journal"):
            hits.setdefault(line, f"imports {name}")
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        called = _called(node)
        if called in _WRITES or (called == "open" and _write_mode(node)):
            hits.setdefault(node.lineno, f"calls {called}")
    return [Hit(line, what) for line, what in sorted(hits.items())]


# --- g. the test beds ---------------------------------------------------------------------

TESTBED = "hpvc.testbed"
# What a test bed stands on is host/ and plan/ (and the shared pieces at the top):
# nothing that runs clusters, and nothing that runs it.
ABOVE_THE_TESTBED = (
    "hpvc.backends", "hpvc.bench", "hpvc.cli", "hpvc.cluster", "hpvc.coordinator",
    "hpvc.image", "hpvc.slurm", "hpvc.spark", "hpvc.store",
)  # fmt: skip
MAY_USE_THE_TESTBED = ("bench", "testbed")


# --- the checks over src/hpvc -------------------------------------------------------------


def violations(
    check: Callable[[Module], list[Hit]], which: Callable[[Module], bool] = lambda m: True
) -> list[str]:
    return [m.where(h) for m in modules() if which(m) for h in check(m)]


def test_the_walk_sees_every_layer() -> None:
    """Guard for the checks below: they see real modules, not an empty or wrong tree."""
    found = {m.name: m for m in modules()}
    assert len(found) > 50
    layers = {m.layer for m in found.values()}
    assert {*PURE_LAYERS, *MAY_READ_HOST, "cluster", "backends", "cli", "testbed"} <= layers
    assert found["hpvc.plan"].is_package and found["hpvc.plan"].layer == "plan"
    assert found["hpvc.errors"].layer == ""


def test_pure_layers_import_nothing_with_side_effects() -> None:
    found = violations(
        lambda m: forbidden_imports(m.source, m.name, m.is_package),
        lambda m: m.layer in PURE_LAYERS,
    )
    assert not found, report(
        f"{'/'.join(PURE_LAYERS)} must stay pure: no import of {', '.join(SIDE_EFFECTS)}", found
    )


CLUSTER_API_USERS = ("bench", "slurm", "cli")


def test_bench_slurm_and_cli_go_through_the_cluster_api() -> None:
    found = violations(
        lambda m: below_the_cluster_api(m.source, m.name, m.is_package),
        lambda m: m.layer in CLUSTER_API_USERS,
    )
    assert not found, report(
        f"{'/'.join(CLUSTER_API_USERS)} reach hosts and backends through hpvc.cluster"
        f" (docs/architecture.md, rule 2), not {', '.join(BELOW_THE_CLUSTER_API)}; only"
        f" the read-only readers {', '.join(READ_ONLY_HOST)} are asked directly:",
        found,
    )


def test_the_read_only_host_readers_change_nothing() -> None:
    found = {m.name: m for m in modules()}
    assert set(READ_ONLY_HOST) <= set(found), "a read-only reader was moved or renamed"
    hits = [found[n].where(h) for n in READ_ONLY_HOST for h in host_writes(found[n].source, n)]
    assert not hits, report(
        "a module bench/, slurm/ and cli/ may ask directly must change nothing on the host;"
        " move the change behind hpvc.cluster, or take the module off READ_ONLY_HOST:",
        hits,
    )


def test_test_beds_stand_on_host_and_plan() -> None:
    found = violations(
        lambda m: forbidden_imports(m.source, m.name, m.is_package, ABOVE_THE_TESTBED),
        lambda m: m.layer == "testbed",
    )
    assert not found, report(
        "hpvc.testbed builds hosts apart from hpvc.host and hpvc.plan only (docs/architecture.md):",
        found,
    )


def test_only_bench_uses_the_test_beds() -> None:
    found = violations(
        lambda m: forbidden_imports(m.source, m.name, m.is_package, (TESTBED,)),
        lambda m: m.layer not in MAY_USE_THE_TESTBED,
    )
    assert not found, report(
        "hpvc.testbed is for tests and benchmarks; the product (cluster, backends, slurm,"
        " cli, ...) never imports it:",
        found,
    )


def test_only_host_and_topology_read_proc_and_sys() -> None:
    found = violations(lambda m: host_path_opens(m.source), lambda m: m.layer not in MAY_READ_HOST)
    assert not found, report(
        "only hpvc.host and hpvc.topology may read /proc or /sys; take a root "
        "(architecture rule 2) or ask hpvc.host:",
        found,
    )


ASK_THE_BACKEND = ("cluster", "slurm")


def test_cluster_and_slurm_do_not_branch_on_kind_or_backend() -> None:
    found = violations(lambda m: kind_branches(m.source), lambda m: m.layer in ASK_THE_BACKEND)
    assert not found, report(
        f"{'/'.join(ASK_THE_BACKEND)} must not tell node kinds or backends apart; put it "
        "behind the Backend protocol (architecture rule 3):",
        found,
    )


def node_kinds_and_backends() -> frozenset[str]:
    """Every node kind and backend name: the fixed ones, and the registry's table."""
    table = registered_backends((PKG / "backends" / "registry.py").read_text(encoding="utf-8"))
    assert {"crun", "qemu", "libvirt"} <= table  # the table is read, not missed
    return _KIND_LITERALS | table


def test_host_does_not_branch_on_a_node_kind_or_backend() -> None:
    kinds = node_kinds_and_backends()
    found = violations(
        lambda m: kind_branches(m.source, kinds, any_literal=False), lambda m: m.layer == "host"
    )
    assert not found, report(
        "hpvc.host must not tell node kinds or backends apart (what a kind of node"
        " leaves, its backend sweeps: Backend.orphans; architecture rule 3):",
        found,
    )


def test_long_modules_say_why() -> None:
    found = violations(lambda m: unexplained_length(m.source))
    assert not found, report(
        f"modules over {LONG_LINES} lines: split them, or say in the module docstring "
        f"why not ({LONG_REASON} ...):",
        found,
    )


def test_packages_import_each_other_without_a_cycle() -> None:
    graph = package_graph(modules())
    assert {"cluster", "backends", "host", "plan", "store", "errors"} <= set(graph)
    assert "backends" in graph["cluster"] and "host" in graph["backends"]  # the walk sees edges
    found = [line for comp in cycles(graph) for line in cycle_report(graph, comp)]
    assert not found, report(
        "packages import each other in a cycle (docs/architecture.md, rule 7); "
        "move the upward import's target down, or pass it in:",
        found,
    )


# --- self-tests: each detector fires on a bad snippet and stays quiet on a good one -------


@pytest.mark.parametrize(
    ("source", "module", "lines"),
    [
        ("import hpvc.host.cgroups\n", "hpvc.plan.place", [1]),
        ("from hpvc.backends import registry\n", "hpvc.render.qemu", [1]),
        ("from hpvc import cluster\n", "hpvc.spec.load", [1]),
        ("import os\n\ndef f():\n    from hpvc.cli import main\n", "hpvc.plan.place", [4]),
        ("from ..host import cgroups\n", "hpvc.plan.place", [1]),
        ("from .. import cli\n", "hpvc.topology.sysfs", [1]),
        ("from ...host.journal import Journal\n", "hpvc.plan.sub.mod", [1]),
        ("from ..backends import x\n", "hpvc.plan", [1]),  # in plan/__init__.py
        ("import importlib\nm = importlib.import_module('hpvc.cluster.ops')\n", "hpvc.plan.a", [2]),
        ("if TYPE_CHECKING:\n    from hpvc.host.journal import Journal\n", "hpvc.render.a", [2]),
    ],
)
def test_forbidden_imports_fire(source: str, module: str, lines: list[int]) -> None:
    is_package = module == "hpvc.plan"
    assert [h.line for h in forbidden_imports(source, module, is_package)] == lines


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("from hpvc.errors import InputError\nfrom hpvc.plan.model import Plan\n", "hpvc.plan.a"),
        ("from . import model\nfrom .model import Plan\n", "hpvc.plan.place"),
        ("from ..topology import model\nfrom ..units import parse_size\n", "hpvc.plan.place"),
        ("import hpvc.hostname\nfrom hpvc import clusters\n", "hpvc.render.a"),  # prefixes only
        ("HOST = 'hpvc.host'\n", "hpvc.spec.a"),  # a string, not an import
    ],
)
def test_forbidden_imports_stay_quiet(source: str, module: str) -> None:
    assert forbidden_imports(source, module) == []


def test_relative_imports_resolve_like_python() -> None:
    assert _absolute("hpvc.plan.place", False, 1, "model") == "hpvc.plan.model"
    assert _absolute("hpvc.plan.place", False, 2, "host") == "hpvc.host"
    assert _absolute("hpvc.plan", True, 1, None) == "hpvc.plan"
    assert _absolute("hpvc.plan", True, 2, "cli") == "hpvc.cli"
    assert _absolute("hpvc.plan.place", False, 0, "hpvc.host") == "hpvc.host"


@pytest.mark.parametrize(
    "source",
    [
        "open('/proc/cpuinfo')",
        "def stat(pid):\n    return open(f'/proc/{pid}/stat')",
        "import os\nfd = os.open('/sys/fs/cgroup/x', os.O_RDONLY)",
        "import io\nio.open('/proc/meminfo')",
        "Path('/sys/block') / name",
        "Path('/proc/cpuinfo').read_text()",
        "pathlib.PurePath('/sys')",
        "os.listdir('/sys/devices/system/node')",
        "glob.glob('/sys/devices/system/cpu/cpu*')",
        "os.path.exists('/proc/' + str(pid))",
        "open(file='/proc/self/status')",
        "PROC = Path('/proc')",
        "PROC = '/proc'",
        "SYS: str = '/sys'",
        "def f(root: Path = Path('/proc')): ...",
        "Path('/') / 'sys' / 'fs'",
        "os.path.join('/', 'proc', str(pid))",
    ],
)
def test_host_path_opens_fire(source: str) -> None:
    """One hit each, on the snippet's last line (where the path is)."""
    hits = host_path_opens(source)
    assert [h.line for h in hits] == [source.count("\n") + 1], hits


@pytest.mark.parametrize(
    "source",
    [
        "MASKED = (\n    '/proc/acpi',\n    '/proc/kcore',\n    '/sys/firmware',\n)",  # oci.py
        "SCRIPT = '''\nmount -t proc proc /proc\nmount -t sysfs sys /sys\n'''",  # files.py
        "mounts = [_mount('/proc', 'proc', 'proc', [])]",
        "sp['path'] = f'/proc/{pid}/ns/net'",
        "open(root / 'proc' / 'cpuinfo')",
        "Path(root, 'sys/devices')",
        "at(root, '/proc/stat')",
        "open('/process/x'); Path('/system'); open('/var/lib/hpvc')",
        "p.write_text('/sys/fs/cgroup')",  # the content, not the path
        "_DIRS = ('dev', 'proc', 'sys')",
        "def f():\n    PROC = '/proc'\n    return PROC",  # not a module constant
        "ROOT = Path('/')",
    ],
)
def test_host_path_opens_stay_quiet(source: str) -> None:
    assert host_path_opens(source) == []


@pytest.mark.parametrize(
    "source",
    [
        "if plan.kind == 'vm':\n    pass",
        "x = 1 if spec.backend == 'libvirt' else 2",
        "if rec.extra.get('backend') == 'crun':\n    pass",
        "if rec.spec['kind'] != 'container':\n    pass",
        "if kind in ('vm', 'container'):\n    pass",
        "if node_kind == 'big':\n    pass",  # any literal against a kind
        "while 'qemu' == name:\n    pass",  # a kind literal against anything
        "ok = [n for n in nodes if n.kind == 'vm']",
        "match plan.kind:\n    case 'vm':\n        pass",
        "match what:\n    case 'libvirt' | 'qemu':\n        pass",
        "assert backend_name not in {'libvirt'}",
    ],
)
def test_kind_branches_fire(source: str) -> None:
    hits = kind_branches(source)
    assert len(hits) == 1, hits
    assert hits[0].line == 1


@pytest.mark.parametrize(
    "source",
    [
        "backend = registry.get(plan.backend)\nbackend.start(node)",
        "if plan.kind == other.kind:\n    pass",  # not against a literal
        "if change.kind == UNDO_KIND:\n    pass",
        "if state == 'running':\n    pass",
        "NAMES = {'vm': 'virtual machine'}",  # data, not a comparison
        "log(f'starting {plan.kind} node')",
        "if kind:\n    pass",
        "match state:\n    case 'running':\n        pass",
        "if kinds == 'x':\n    pass",  # 'kinds' is not 'kind'
    ],
)
def test_kind_branches_stay_quiet(source: str) -> None:
    assert kind_branches(source) == []


@pytest.mark.parametrize(
    "source",
    [
        "if o.kind == 'container':\n    pass",
        "if plan.kind != 'vm':\n    pass",
        "if name in ('libvirt', 'x'):\n    pass",
        "match b:\n    case 'crun':\n        pass",
        "if backend == 'firecracker':\n    pass",  # a name only the registry has
    ],
)
def test_kind_branches_by_name_fire(source: str) -> None:
    hits = kind_branches(source, _KIND_LITERALS | {"firecracker"}, any_literal=False)
    assert [h.line for h in hits] == [1], hits


@pytest.mark.parametrize(
    "source",
    [
        "if kind == 'bridge':\n    pass",  # host/orphans.py: a link's kind
        "ok = kind in ('veth', 'tun')",
        "if e.kind == 'hugepages-added':\n    pass",  # host/hugepages.py: a journal's
        "match o.kind:\n    case 'netns':\n        pass",
    ],
)
def test_kind_branches_by_name_stay_quiet_on_other_kinds(source: str) -> None:
    assert kind_branches(source, _KIND_LITERALS, any_literal=False) == []
    assert kind_branches(source) != []  # where any literal counts (cluster/), they fire


def test_the_registry_table_is_read() -> None:
    source = 'BACKENDS: dict[str, str] = {\n    "crun": "m:C",\n    "fc": "m:F",\n}\nX = {"a": 1}\n'
    assert registered_backends(source) == {"crun", "fc"}
    assert registered_backends('BACKENDS = {"qemu": "m:Q"}') == {"qemu"}
    assert registered_backends("OTHER = {'x': 'y'}") == frozenset()


def test_unexplained_length() -> None:
    body = "x = 1\n" * LONG_LINES
    assert unexplained_length('"""Short."""\n' + body) == [
        Hit(1, f"{LONG_LINES + 1} lines, no 'Long because' in the module docstring")
    ]
    assert unexplained_length("# Long because\n" + body) != []  # a comment is no docstring
    assert (
        unexplained_length('"""Backends.\n\nLong because the protocol is one unit."""\n' + body)
        == []
    )
    assert unexplained_length('"""Short."""\n' + "x = 1\n" * (LONG_LINES - 1)) == []


def test_a_report_lists_file_and_line() -> None:
    m = Module(PKG / "cluster" / "x.py", "hpvc.cluster.x", "if plan.kind == 'vm':\n    pass\n")
    (hit,) = kind_branches(m.source)
    assert m.where(hit) == "src/hpvc/cluster/x.py:1 plan.kind == 'vm'"
    assert report("title", ["a:1 x", "b:2 y"]) == "title\n  a:1 x\n  b:2 y"


def _mods(sources: dict[str, str]) -> list[Module]:
    return [Module(PKG / "x.py", name, src) for name, src in sources.items()]


@pytest.mark.parametrize(
    "sources",
    [
        {"hpvc.a.x": "import hpvc.b.y\n", "hpvc.b.y": "from hpvc.a import x\n"},
        {"hpvc.a.x": "def f():\n    from hpvc.b import y\n", "hpvc.b.y": "import hpvc.a\n"},
        {
            "hpvc.a.x": "if TYPE_CHECKING:\n    from hpvc.b.y import T\n",
            "hpvc.b.y": "from hpvc.c import z\n",
            "hpvc.c.z": "from ..a.x import f\n",
        },
        {"hpvc.a.x": "from hpvc import errors\n", "hpvc.errors": "import hpvc.a.x\n"},
    ],
)
def test_cycles_fire(sources: dict[str, str]) -> None:
    graph = package_graph(_mods(sources))
    (comp,) = cycles(graph)
    assert comp == sorted({unit_of(n) for n in sources if unit_of(n)})
    assert all(" -> " in line for line in cycle_report(graph, comp))


def test_cycles_stay_quiet() -> None:
    sources = {
        "hpvc.a.x": "import hpvc.b.y\nfrom hpvc.a import z\n",  # inside a package is no cycle
        "hpvc.a.z": "from hpvc.a import x\n",
        "hpvc.b.y": "import hpvc.c\nX = 'hpvc.a'\n",  # a string is no import
        "hpvc.c": "import os\nimport hpvcx.a\n",
    }
    graph = package_graph(_mods(sources))
    assert graph == {"a": {"b": "x.py:1"}, "b": {"c": "x.py:1"}, "c": {}}
    assert cycles(graph) == []


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ("from hpvc.host import cgroups\n", [1]),
        ("import hpvc.host.net\n", [1]),
        ("from hpvc.host.vxlan import join\n", [1]),
        ("from hpvc.backends import registry\n", [1]),
        ("def f():\n    from hpvc.host import accel, net\n", [2]),  # one bad name is enough
        ("from ...host import journal\n", [1]),
    ],
)
def test_below_the_cluster_api_fires(source: str, lines: list[int]) -> None:
    assert [h.line for h in below_the_cluster_api(source, "hpvc.bench.x.runner")] == lines


@pytest.mark.parametrize(
    "source",
    [
        "from hpvc.host import accel, hwinfo, usage\n",
        "from hpvc.host.accel import accelerator\n",
        "import hpvc.host.fabric\nimport hpvc.host\n",
        "from hpvc.host.doctor import Report\n",
        "from hpvc.cluster import inspect\nfrom hpvc.hostname import x\n",  # prefixes only
    ],
)
def test_below_the_cluster_api_stays_quiet(source: str) -> None:
    assert below_the_cluster_api(source, "hpvc.cli.doctor") == []


@pytest.mark.parametrize(
    "source",
    [
        "from hpvc.host.journal import Journal\n",
        "from .journal import undoer\n",
        "@undoer('x')\ndef _undo(args): ...\n",
        "Path(p).write_text('1')\n",
        "subprocess.run(['modprobe', 'kvm'])\n",
        "open(path, 'w')\n",
        "open(path, mode='a')\n",
        "os.mkdir(d)\n",
        "journal.record('bridge', name=n)\n",
    ],
)
def test_host_writes_fire(source: str) -> None:
    hits = host_writes(source, "hpvc.host.reader")
    assert len(hits) == 1, hits


@pytest.mark.parametrize(
    "source",
    [
        "open(path).read()\n",
        "open(path, 'rb')\n",
        "Path(p).read_text()\n",
        "FIX = 'modprobe kvm_intel; mkdir -p /dev/hugepages'\n",  # advice, not a call
        "from hpvc.host.probe import read_mounts\n",
    ],
)
def test_host_writes_stay_quiet(source: str) -> None:
    assert host_writes(source, "hpvc.host.reader") == []

"""The layering of docs/architecture.md ("Layers"), enforced: every import of every module of
the ``cotenant`` package (module-level, function-level and ``TYPE_CHECKING`` ones alike) follows
an allowed arrow between its layers, imports only public names across layers, and no module
takes part in an import cycle.

A layer is a subpackage (``cotenant.store`` is the layer ``store``); ``cli`` (the commands) and
``app`` (configuration, wiring, the running service) are the composition root; the modules
directly in ``cotenant/`` (only ``__main__``) are the layer ``cotenant``.
The checker works on a mapping of module -> imports, so the self-checks at the end feed it
synthetic sources and assert that it reports what it must.
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
from collections.abc import Container, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
ROOT_PACKAGE = "cotenant"

LAYERS = (
    "core",
    "store",
    "collectors",
    "analysis",
    "actuators",
    "gateway",
    "alerts",
    "dashboard",
    "reports",
    "simulator",
    "evaluation",
    "app",
    "cli",
    "cotenant",
)
NOT_IMPORTABLE = ("tests", "bench", "scripts")
"""Folders of ours that no package may import (they hold no library code)."""

ALLOWED: dict[str, frozenset[str]] = {
    "cotenant": frozenset({"cli"}),
    "cli": frozenset(LAYERS) - {"cli", "cotenant"},
    "app": frozenset(
        {"dashboard", "reports", "actuators", "alerts", "collectors", "analysis", "store", "core"}
    ),
    "evaluation": frozenset({"simulator", "actuators", "analysis", "collectors", "store", "core"}),
    "dashboard": frozenset({"analysis", "store", "core"}),
    "reports": frozenset({"analysis", "store", "core"}),
    "actuators": frozenset({"analysis", "store", "core"}),
    "gateway": frozenset({"core"}),
    "alerts": frozenset({"analysis", "store", "core"}),
    "simulator": frozenset({"collectors", "store", "core"}),
    "analysis": frozenset({"store", "core"}),
    "collectors": frozenset({"store", "core"}),
    "store": frozenset({"core"}),
    "core": frozenset(),
}
"""Layer -> the layers it may import (imports inside a layer are always allowed). The same
table as docs/architecture.md's "Layers" (checked by a test below)."""


def layer_of(dotted: str) -> str | None:
    """The layer a dotted module or name belongs to: ``cotenant.store.db`` -> ``store``,
    ``cotenant.cli.main`` -> ``cli``, ``cotenant.__main__`` -> ``cotenant``; a folder nobody
    may import (``tests.spans``) -> its name; anything else (the standard library, third
    parties) -> None."""
    parts = dotted.split(".")
    if parts[0] in NOT_IMPORTABLE:
        return parts[0]
    if parts[0] != ROOT_PACKAGE:
        return None
    if len(parts) > 1 and parts[1] in LAYERS and parts[1] != ROOT_PACKAGE:
        return parts[1]
    return ROOT_PACKAGE


@dataclass(frozen=True)
class Import:
    """One imported name: ``target`` is absolute and dotted
    (``cotenant.simulator.engine.Simulation`` for ``from cotenant.simulator.engine import
    Simulation``), ``line`` is where the import statement starts in ``path``."""

    module: str
    path: str
    line: int
    target: str


def parse_imports(module: str, path: str, text: str, *, is_package: bool = False) -> list[Import]:
    """Every import in ``text`` (the source of ``module``), wherever it is in the file: module
    level, inside functions and classes, under ``if TYPE_CHECKING:`` or ``try:``; relative
    imports resolved against ``module`` (a package's ``__init__`` when ``is_package``), and
    ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name. Raises
    SyntaxError for a file that does not parse."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    out: list[Import] = []
    for node in ast.walk(ast.parse(text, filename=path)):
        targets: list[str] = []
        if not isinstance(node, ast.stmt | ast.expr):
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                parent = ".".join([*base, *([node.module] if node.module else [])])
            else:
                parent = node.module or ""
            targets = [f"{parent}.{alias.name}" for alias in node.names if alias.name != "*"]
            if not targets:  # from x import *
                targets = [parent]
        elif isinstance(node, ast.Call) and _dynamic_import(node):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                targets = [arg.value]
        out.extend(Import(module, path, node.lineno, t) for t in targets if t)
    return out


def _dynamic_import(node: ast.Call) -> bool:
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name in ("import_module", "__import__") and bool(node.args)


def resolve(target: str, known: Container[str]) -> str | None:
    """The module ``target`` names or lives in (its longest prefix that is a module); None
    when it is not one of the ``known`` modules."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in known:
            return candidate
    return None


def arrow_problems(
    imports: Mapping[str, list[Import]], allowed: Mapping[str, frozenset[str]] = ALLOWED
) -> list[str]:
    """One line per import that crosses packages against ``allowed`` (or reaches into a
    folder nobody may import, or takes a private name across packages), naming the file, the
    line and the arrow."""
    problems = []
    for module in sorted(imports):
        src = layer_of(module)
        for imp in imports[module]:
            dst = layer_of(imp.target)
            if dst is None or dst == src:
                continue
            if dst in NOT_IMPORTABLE or (dst in allowed and dst not in allowed.get(src or "", ())):
                problems.append(
                    f"{imp.path}:{imp.line}: forbidden arrow {src}/ -> {dst}/ "
                    f"({module} imports {imp.target})"
                )
            elif any(_private(p) for p in imp.target.split(".")[1:]):
                problems.append(
                    f"{imp.path}:{imp.line}: {module} imports {imp.target}, a private name "
                    f"of {dst}/ (only public names cross layers)"
                )
    return problems


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def cycles(imports: Mapping[str, list[Import]]) -> list[str]:
    """One line per import cycle among the modules of ``imports``: one per strongly connected
    group, shown as its shortest cycle through the group's first module with the import line
    of each step, and the group's other modules."""
    edges: dict[str, dict[str, Import]] = {m: {} for m in imports}
    for module, imps in imports.items():
        for imp in imps:
            dst = resolve(imp.target, imports)
            if dst is not None and dst != module:
                edges[module].setdefault(dst, imp)
    out = []
    for group in _strongly_connected(edges):
        first = min(group)
        path = _shortest_cycle(first, edges, group)
        steps = [edges[a][b] for a, b in itertools.pairwise(path)]
        where = ", ".join(f"{s.path}:{s.line}" for s in steps)
        more = sorted(group - set(path))
        also = f"; in a cycle with these too: {', '.join(more)}" if more else ""
        out.append(f"import cycle: {' -> '.join(path)} ({where}){also}")
    return sorted(out)


def _strongly_connected(edges: Mapping[str, Mapping[str, Import]]) -> list[set[str]]:
    """Tarjan's algorithm; only groups of two or more modules (no module imports itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return groups


def _shortest_cycle(
    start: str, edges: Mapping[str, Mapping[str, Import]], group: set[str]
) -> list[str]:
    """``start -> ... -> start`` by breadth-first search inside ``group``."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w in group and w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in no cycle of its group")  # Tarjan's group guarantees one


def module_name(path: Path) -> tuple[str, bool]:
    """``cotenant/analysis/loop.py`` -> (``cotenant.analysis.loop``, False);
    ``cotenant/store/__init__.py`` -> (``cotenant.store``, True)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


@functools.cache
def repository_imports() -> dict[str, list[Import]]:
    """Every module of the ``cotenant`` package -> its imports (read once per test session)."""
    out = {}
    for path in sorted((ROOT / ROOT_PACKAGE).rglob("*.py")):
        module, is_package = module_name(path)
        rel = str(path.relative_to(ROOT))
        out[module] = parse_imports(
            module, rel, path.read_text(encoding="utf-8"), is_package=is_package
        )
    return out


def documented_layers(text: str) -> dict[str, frozenset[str]]:
    """The "Layers" table of docs/architecture.md as package -> packages it may import."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    table: dict[str, frozenset[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        (package,) = re.findall(r"`(\w+)/`", cells[0])
        table[package] = frozenset(re.findall(r"`(\w+)/`", cells[1]))
    return table


# -- the repository ----------------------------------------------------------------------


def test_every_import_follows_an_allowed_arrow() -> None:
    problems = arrow_problems(repository_imports())
    assert not problems, "\n".join(problems)


def test_no_import_cycle() -> None:
    found = cycles(repository_imports())
    assert not found, "\n".join(found)


def test_every_subpackage_is_in_the_table() -> None:
    on_disk = {p.parent.name for p in (ROOT / ROOT_PACKAGE).glob("*/__init__.py")}
    assert on_disk | {ROOT_PACKAGE} == set(LAYERS) == set(ALLOWED)


def test_one_root_package() -> None:
    # a plain install puts one name into site-packages: nothing of ours beside cotenant/
    top = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert top == {ROOT_PACKAGE}


def test_the_table_is_the_one_in_docs_architecture() -> None:
    assert documented_layers(ARCHITECTURE.read_text(encoding="utf-8")) == ALLOWED


def test_the_checker_reads_the_repository() -> None:
    # a guard against a checker that silently reads nothing: known arrows are seen
    imports = repository_imports()
    assert {
        "cotenant.cli.main",
        "cotenant.evaluation.closed_loop",
        "cotenant.analysis.loop",
    } <= set(imports)
    targets = {layer_of(i.target) for i in imports["cotenant.evaluation.closed_loop"]}
    assert {"simulator", "actuators", "analysis", "store"} <= targets


# -- the checker itself --------------------------------------------------------------------


def _synthetic(sources: Mapping[str, str]) -> dict[str, list[Import]]:
    return {m: parse_imports(m, m.replace(".", "/") + ".py", text) for m, text in sources.items()}


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        pytest.param(
            {"cotenant.analysis.bench": "from cotenant.simulator.engine import Simulation\n"},
            ["cotenant/analysis/bench.py:1: forbidden arrow analysis/ -> simulator/"],
            id="module-level",
        ),
        pytest.param(
            {
                "cotenant.dashboard.app": "import os\n\ndef f():\n"
                "    import cotenant.actuators.controller\n"
            },
            ["cotenant/dashboard/app.py:4: forbidden arrow dashboard/ -> actuators/"],
            id="function-level",
        ),
        pytest.param(
            {
                "cotenant.store.db": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from cotenant.app.config import Config\n"
            },
            ["cotenant/store/db.py:3: forbidden arrow store/ -> app/"],
            id="type-checking",
        ),
        pytest.param(
            {"cotenant.core.errors": "from cotenant.store.db import Store\n"},
            ["cotenant/core/errors.py:1: forbidden arrow core/ -> store/"],
            id="core-imports-nothing",
        ),
        pytest.param(
            {"cotenant.gateway.x": "from cotenant.actuators.policy import Policy\n"},
            ["cotenant/gateway/x.py:1: forbidden arrow gateway/ -> actuators/"],
            id="gateway-apart",
        ),
        pytest.param(
            {
                "cotenant.actuators.x": "import importlib\n"
                "importlib.import_module('cotenant.evaluation.accuracy')\n"
            },
            ["cotenant/actuators/x.py:2: forbidden arrow actuators/ -> evaluation/"],
            id="import_module",
        ),
        pytest.param(
            {"cotenant.reports.x": "from tests.spans import span\n"},
            ["cotenant/reports/x.py:1: forbidden arrow reports/ -> tests/"],
            id="tests-folder",
        ),
        pytest.param(
            {"cotenant.simulator.x": "from cotenant.collectors.nvml import _Struct\n"},
            [
                "cotenant/simulator/x.py:1: cotenant.simulator.x imports "
                "cotenant.collectors.nvml._Struct, a private name"
            ],
            id="private-name",
        ),
        pytest.param(
            {
                "cotenant.evaluation.x": "from cotenant.simulator import engine\n"
                "from cotenant.core.errors import Error\nimport numpy\n",
                "cotenant.cli.y": "from cotenant.evaluation.x import run\n",
                "cotenant.analysis.z": "from . import windows\nfrom ._math import mad\n",
            },
            [],
            id="allowed",
        ),
    ],
)
def test_the_checker_reports_forbidden_arrows(sources: dict[str, str], expected: list[str]) -> None:
    problems = arrow_problems(_synthetic(sources))
    assert len(problems) == len(expected), problems
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start), problem


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        pytest.param(
            {
                "alerts.rules": "def render():\n    from alerts.rules_cotenant import groups\n",
                "alerts.rules_cotenant": "from alerts.rules import Alert\n",
            },
            [
                "import cycle: alerts.rules -> alerts.rules_cotenant -> alerts.rules "
                "(alerts/rules.py:2, alerts/rules_cotenant.py:1)"
            ],
            id="two-modules-deferred",
        ),
        pytest.param(
            {
                "a.one": "from a.two import x\n",
                "a.two": "import typing\nif typing.TYPE_CHECKING:\n    import a.three\n",
                "a.three": "from . import one\n",
                "a.four": "import a.one\n",
            },
            [
                "import cycle: a.one -> a.two -> a.three -> a.one "
                "(a/one.py:1, a/two.py:3, a/three.py:1)"
            ],
            id="three-modules-type-checking-relative",
        ),
        pytest.param(
            {
                "r.rules": "from r.ours import g\nfrom r.theirs import h\n",
                "r.ours": "from r.rules import Alert\n",
                "r.theirs": "from r.rules import Alert\n",
            },
            [
                "import cycle: r.ours -> r.rules -> r.ours (r/ours.py:1, r/rules.py:1); "
                "in a cycle with these too: r.theirs"
            ],
            id="group-of-three",
        ),
        pytest.param(
            {"a.one": "import a.two\n", "a.two": "import a.three\n", "a.three": "import os\n"},
            [],
            id="no-cycle",
        ),
    ],
)
def test_the_checker_reports_cycles(sources: dict[str, str], expected: list[str]) -> None:
    assert cycles(_synthetic(sources)) == expected


def test_the_doc_table_is_parsed() -> None:
    text = (
        "# x\n\n## Layers\n\n| package | may import | why |\n|---|---|---|\n"
        "| `a/` | `b/`, `c/` | because |\n| `c/` | — | base |\n\n## Next\n\n| `z/` | `a/` | no |\n"
    )
    assert documented_layers(text) == {"a": frozenset({"b", "c"}), "c": frozenset()}

"""One definition of breach: no module compares a latency with an SLO itself.

Every reader (detector, verification, reports, alerts, dashboard, scoring) calls
``cotenant.core.slos.breach`` / ``breach_sql``, so a model pages exactly when its incident says
breach and the report counts the same minutes. This scans the package's syntax for an ordering
comparison (``<``, ``<=``, ``>``, ``>=``) with an operand named like an SLO (constants in
capitals are settings, not SLOs); ``x > 0`` (whether an SLO is set at all) is allowed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "cotenant"
DEFINED_IN = ROOT / "core" / "slos.py"
SLO_NAME = re.compile(r"(^|_)slos?($|_)", re.IGNORECASE)
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _names(node: ast.AST) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0


def slo_comparisons(source: str) -> list[int]:
    """Line numbers of ordering comparisons with an SLO-named operand against anything but 0."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare) or not any(isinstance(o, ORDERING) for o in node.ops):
            continue
        operands = [node.left, *node.comparators]
        if any(_is_zero(o) for o in operands):
            continue
        named = {name for o in operands for name in _names(o) if not name.isupper()}
        if any(SLO_NAME.search(name) for name in named):
            lines.append(node.lineno)
    return lines


def test_the_scan_sees_a_comparison_with_an_slo() -> None:
    assert slo_comparisons("over = p99 > slo_ms\n") == [1]
    assert slo_comparisons("ok = now <= 1.5 * s.slo\n") == [1]
    fine = "has = slo_ms > 0\nslow = slowdown >= 2\nn = slots < 3\nk = n < SLO_MIN_N\n"
    assert slo_comparisons(fine) == []


def test_no_module_but_core_slos_compares_a_latency_with_an_slo() -> None:
    found = [
        f"{p.relative_to(ROOT.parent)}:{line}"
        for p in sorted(ROOT.rglob("*.py"))
        if p != DEFINED_IN
        for line in slo_comparisons(p.read_text())
    ]
    assert not found, "compare with an SLO through cotenant.core.slos.breach:\n" + "\n".join(found)

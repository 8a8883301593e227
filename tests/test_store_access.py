"""Store access goes through ``store/``: no package outside it writes SQL on a store table.

The other packages call the typed functions of ``store`` (``store.queries``,
``store.incident_rows``, ``store.action_rows``, ``store.alert_rows``,
``store.report_queries``, ``store.dashboard_queries``, ``store.bulk_load``,
``store.source``), so a schema change is made, and checked, in one package. ``bench/`` and
``tests/`` may keep SQL of their own.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cotenant.store.schema import TABLES

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cotenant"
EXEMPT = {"store"}

_TABLE_NAMES = sorted([*TABLES, "meta"], key=len, reverse=True)
SQL_ON_TABLE = re.compile(
    r"\b(FROM|JOIN|INSERT\s+(?:OR\s+REPLACE\s+)?INTO|UPDATE|DELETE\s+FROM)\s+"
    r"((?:" + "|".join(map(re.escape, _TABLE_NAMES)) + r")(?!\w)|\{)",
)
"""A SQL clause (upper-case keywords, as this code base writes them) naming a store table,
or an f-string placeholder where a table name goes (``INSERT INTO {name}``)."""


def _packages() -> list[Path]:
    """Every layer of ``cotenant`` but ``store`` (``bench/`` and ``tests/`` are not in it)."""
    return sorted(
        d
        for d in PACKAGE.iterdir()
        if d.is_dir() and (d / "__init__.py").exists() and d.name not in EXEMPT
    )


def _offences(text: str) -> list[tuple[int, str, str]]:
    """(line, clause, table) of every SQL clause on a store table in ``text``."""
    out = []
    for m in SQL_ON_TABLE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        table = "<interpolated>" if m.group(2) == "{" else m.group(2)
        out.append((line, " ".join(m.group(1).split()), table))
    return out


@pytest.mark.parametrize(
    ("text", "table"),
    [
        ("SELECT * FROM requests WHERE x", "requests"),
        ('"SELECT 1 FROM request_rollup_1m LIMIT 1"', "request_rollup_1m"),
        ("a JOIN actions x ON", "actions"),
        ("INSERT OR REPLACE INTO incidents (id)", "incidents"),
        ("INSERT INTO audit (ts_ns)", "audit"),
        ("UPDATE alerts SET", "alerts"),
        ("DELETE FROM pending_spans", "pending_spans"),
        ('f"INSERT INTO {name} BY NAME"', "<interpolated>"),
    ],
)
def test_the_pattern_finds_sql_on_store_tables(text: str, table: str) -> None:
    assert [t for _, _, t in _offences(text)] == [table]


@pytest.mark.parametrize(
    "text",
    [
        "from store.incident_rows import find_incidents",
        "the requests from the gateway",
        "SELECT * FROM requests_view",
        "FROM _cotenant_batch",
    ],
)
def test_the_pattern_leaves_other_text_alone(text: str) -> None:
    assert _offences(text) == []


def test_the_packages_outside_store_write_no_sql_on_store_tables() -> None:
    packages = _packages()
    assert {p.name for p in packages} >= {"analysis", "actuators", "reports", "dashboard"}
    found = []
    root_modules = sorted(PACKAGE.glob("*.py"))  # the composition root
    for path in [*root_modules, *(p for pkg in packages for p in sorted(pkg.rglob("*.py")))]:
        rel = path.relative_to(ROOT)
        for line, clause, table in _offences(path.read_text(encoding="utf-8")):
            found.append(f"{rel}:{line}: {clause} {table}")
    assert not found, (
        "SQL on store tables outside store/ (add a typed function to store/ and call it):\n"
        + "\n".join(found)
    )

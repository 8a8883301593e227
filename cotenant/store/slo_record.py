"""The SLOs a store was analysed with, kept in the store itself.

``cotenant serve`` (and the demo, whose scenario's SLOs flow into its configuration) records
the ``[analysis] slo_ms`` it runs with in the ``meta`` table; commands that read the file
afterwards (``cotenant report --store``, ``cotenant diagnose --store``) start from these and
let their own configuration override a model's value. So a report written after the demo
shows the demo's SLO attainment, not "no SLO".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from cotenant.store.db import Store

META_KEY = "slo_ms"


def record_slos(store: Store, slo_ms: Mapping[str, float]) -> None:
    """Record ``slo_ms`` (model -> p99 SLO in ms) as the SLOs in force, replacing any."""
    value = json.dumps({str(m): float(v) for m, v in sorted(slo_ms.items())})
    with store.cursor() as cur:
        cur.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [META_KEY, value])


def recorded_slos(store: Store) -> dict[str, float]:
    """The SLOs last recorded (empty when none, or when the record is unreadable)."""
    with store.cursor() as cur:
        row = cur.execute("SELECT value FROM meta WHERE key = ?", [META_KEY]).fetchone()
    if row is None:
        return {}
    try:
        raw = json.loads(row[0])
    except (TypeError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {
        str(m): float(v)
        for m, v in raw.items()
        if isinstance(v, int | float) and math.isfinite(v) and v > 0
    }

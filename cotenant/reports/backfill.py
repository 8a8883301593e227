"""Diagnose a stored range from its per-minute rollups and record the incidents.

The continuous loop writes incidents as they happen. Where it did not run over a range (a
store filled by another path, e.g. :mod:`simulator.week`, or rows imported later), this runs
the same analysis — :func:`analysis.diagnose.diagnose_windows` on one-minute windows, which
:class:`store.source.StoreSource` serves from the rollups, never the raw rows — and merges
the diagnoses into the ``incidents`` table through :class:`analysis.incidents.IncidentBook`.
"""

from __future__ import annotations

from collections.abc import Mapping

from cotenant.analysis.detector.detect import DetectorParams
from cotenant.analysis.diagnose import diagnose_windows, history_range
from cotenant.analysis.incident_record import Incident
from cotenant.analysis.incidents import IncidentBook
from cotenant.analysis.windows import gpu_windows
from cotenant.core.errors import QueryError
from cotenant.core.timerange import TimeRange
from cotenant.store.db import Store
from cotenant.store.queries import rollup_model_gpus
from cotenant.store.source import StoreSource

STEP_S = 60.0


def backfill_incidents(
    store: Store,
    since_ns: int,
    until_ns: int,
    *,
    slo_ms: Mapping[str, float] | None = None,
    params: DetectorParams | None = None,
) -> list[Incident]:
    """Diagnose every (model, GPU) of ``[since, until)`` at one-minute windows and write the
    incidents found. Returns them. Raises QueryError for an empty or reversed range."""
    if until_ns <= since_ns:
        raise QueryError("backfill: until must be after since")
    p = params or DetectorParams()
    source = StoreSource(store)
    book = IncidentBook(store, gap_ns=int(5 * STEP_S * 1e9))
    full, first = history_range(TimeRange(since_ns, until_ns), STEP_S, p)
    by_gpu: dict[str, list[str]] = {}
    for model, gpu in rollup_model_gpus(store, TimeRange(since_ns, until_ns)):
        by_gpu.setdefault(gpu, []).append(model)
    written: list[Incident] = []
    for gpu, models in by_gpu.items():
        w = gpu_windows(source, gpu, full, STEP_S)
        for model in models:
            if model not in w.models:
                continue
            slo = (slo_ms or {}).get(model)
            diags = diagnose_windows(source, w, model, first, slo_ms=slo, params=p)
            events = book.update(diags, model, gpu, since_ns, until_ns)
            written += list({e.incident.id: e.incident for e in events}.values())
    return written

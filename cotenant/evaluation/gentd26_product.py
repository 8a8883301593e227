"""``cotenant bench --gentd26``: the GenTD26 trace through the product, scored by the measures of
:mod:`cotenant.evaluation.gentd26_measures`.

**The product's path.** The trace is imported into an embedded store with the product's
importer (:func:`~cotenant.evaluation.gentd26_import.import_trace`, what ``cotenant
import-gentd26`` runs), then each serving model (``sd-pool-a``, ``sd-pool-b``) is diagnosed
over the whole trace by the product's on-demand analysis, built as ``cotenant diagnose
--store FILE --model M --since ... --until ...`` builds it from an empty configuration.
The diagnoses that are incidents (``incident: true``) are scored; an incident's container is
its ``replica`` (or its ``gpu``: each container is its own GPU in the import), or the whole
model when it names neither.

Raises :class:`~cotenant.core.errors.TraceError` for a missing or malformed trace folder.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cotenant.evaluation.gentd26 import STEP_S, Trace, load_trace
from cotenant.evaluation.gentd26_measures import measure
from cotenant.evaluation.gentd26_steps import NamedCause, TraceIncident

SERVING_MODELS = ("sd-pool-a", "sd-pool-b")


def _diagnoses(trace: Trace, models: Sequence[str]) -> tuple[list[dict[str, Any]], float]:
    """Import ``trace`` into an in-memory store and diagnose each model over all of it with
    the product's analysis: (every diagnosis, seconds the import took)."""
    from cotenant.analysis.analyzer import Analyzer
    from cotenant.analysis.incidents import IncidentBook
    from cotenant.analysis.settings import AnalysisSettings
    from cotenant.core.slos import Slos
    from cotenant.evaluation.gentd26_import import import_trace
    from cotenant.store.db import Store
    from cotenant.store.slo_record import recorded_slos
    from cotenant.store.source import StoreSource

    t0 = time.perf_counter()
    store = Store(":memory:")
    try:
        import_trace(store, trace)
        import_s = time.perf_counter() - t0
        # what cotenant diagnose builds from an empty configuration
        analyzer = Analyzer(
            StoreSource(store),
            IncidentBook(store),
            slos=Slos.of_maps(recorded_slos(store)),
            params=AnalysisSettings().detector_params(),
        )
        start_ns = (int(trace.ts[0]) - STEP_S) * 1_000_000_000
        end_ns = (int(trace.ts[-1]) + STEP_S) * 1_000_000_000
        out: list[dict[str, Any]] = []
        for m in models:
            out += analyzer.diagnose(m, start_ns, end_ns)["diagnoses"]
        return out, import_s
    finally:
        store.close()


def from_diagnosis(d: dict[str, Any], containers: set[str]) -> TraceIncident:
    """A product diagnosis (``Diagnosis.to_dict``) as an incident to score."""
    where = d.get("replica") or d.get("gpu")
    return TraceIncident(
        model=str(d["model"]),
        container=where if where in containers else None,
        start_s=d["start_ns"] / 1e9,
        end_s=d["end_ns"] / 1e9,
        causes=tuple(
            NamedCause(str(c["kind"]), str(c.get("culprit") or ""), float(c.get("share") or 0))
            for c in d.get("causes", [])
        ),
    )


def product_incidents(trace: Trace) -> dict[str, Any]:
    """The product's incidents on ``trace`` (each serving model it holds diagnosed):
    ``{"diagnoses", "incidents": [TraceIncident], "import_s", "diagnose_s"}``."""
    t0 = time.perf_counter()
    models = [m for m in SERVING_MODELS if m in set(trace.models())]
    diagnoses, import_s = _diagnoses(trace, models)
    containers = set(trace.containers)
    incidents = [from_diagnosis(d, containers) for d in diagnoses if d.get("incident")]
    return {
        "diagnoses": len(diagnoses),
        "incidents": incidents,
        "import_s": import_s,
        "diagnose_s": time.perf_counter() - t0 - import_s,
    }


def _incident_dict(i: TraceIncident) -> dict[str, Any]:
    return {
        "model": i.model,
        "container": i.container,
        "start_s": i.start_s,
        "end_s": i.end_s,
        "causes": [c.__dict__ for c in i.causes],
    }


def bench(folder: Path | str | None = None) -> dict[str, Any]:
    """Load the trace, run the product over it and measure its incidents (JSON-ready)."""
    t0 = time.perf_counter()
    trace = load_trace(folder)
    load_s = time.perf_counter() - t0
    product = product_incidents(trace)
    t1 = time.perf_counter()
    out: dict[str, Any] = {
        "trace": {
            "folder": str(trace.folder),
            "steps": len(trace.ts),
            "containers": len(trace.containers),
            "start_s": int(trace.ts[0]),
            "end_s": int(trace.ts[-1]),
        },
        "product": {
            "diagnoses": product["diagnoses"],
            "measures": measure(trace, product["incidents"]),
            "incidents": [_incident_dict(i) for i in product["incidents"]],
            "import_s": round(product["import_s"], 2),
            "diagnose_s": round(product["diagnose_s"], 2),
        },
        "load_s": round(load_s, 2),
    }
    out["product"]["measure_s"] = round(time.perf_counter() - t1, 2)
    out["run_s"] = round(time.perf_counter() - t0, 2)
    return out


def _pct(r: dict[str, Any]) -> str:
    if r["rate"] is None:
        return f"— (n = {r['n']})"
    lo, hi = r["ci90"]
    return f"{r['rate']:.2f} ({r['k']}/{r['n']}; 90 % {lo:.2f}-{hi:.2f})"


def _share(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def render_measures(name: str, m: dict[str, Any]) -> list[str]:
    """One detector's measures, a few lines for the terminal."""
    d, e = m["detection"], m["explained"]
    lines = [
        f"{name}: {d['incidents']} incidents in the second half"
        + (f" ({d['model_wide_incidents']} model-wide)" if d["model_wide_incidents"] else ""),
        f"  recall of {d['spike_events']} unambiguous spike events: {_pct(d['recall'])}; "
        f"their excess covered {_share(d['spike_excess_covered'])}",
        f"  precision: {_pct(d['precision'])}; covered steps elevated: {_pct(d['step_precision'])}",
        f"  excess explained (not unknown): {_share(e['explained_share'])} of "
        f"{e['excess_h']:.2f} h; by causes enriched >= 2x: "
        f"{_share(e['explained_by_enriched_share'])}; {e['naming_nothing']} incidents name "
        "nothing",
    ]
    for key, c in m["causes"].items():
        if c["untestable"]:
            lines.append(f"  {key}: named in {c['windows']} windows; no evidence in the trace")
            continue
        ci = c["ci90"]
        lines.append(
            f"  {key}: evidence in {c['with_evidence']} of {c['windows']} named windows, "
            f"base rate {_share(c['base_rate_first_half'])} (first half) -> enrichment "
            + ("—" if c["enrichment"] is None else f"{c['enrichment']:.1f}x")
            + (f" (90 % {ci[0]:.1f}-{ci[1]:.1f})" if ci else "")
        )
    return lines


def render(result: dict[str, Any]) -> str:
    """What ``cotenant bench --gentd26`` prints."""
    t, p = result["trace"], result["product"]
    h = p["measures"]["halves"]
    lines = [
        f"GenTD26 {t['folder']}: {t['containers']} containers, {t['steps']} steps; halves cut "
        f"at step {h['split_step']} ({h['e2e_rows'][0]} / {h['e2e_rows'][1]} e2e rows): rates "
        "and levels fitted on the first, figures on the second",
        f"product (import + on-demand diagnosis of {', '.join(SERVING_MODELS)}): "
        f"{p['diagnoses']} diagnoses",
        *render_measures("product", p["measures"]),
    ]
    for pool, pm in p["measures"]["pools"].items():
        lines += render_measures(f"{pool} ({pm['containers']} containers)", pm)
        sp = pm["spike_steps"]
        lines.append(
            f"  unambiguous spike steps: {_pct(sp['judged'])} of judged steps; "
            f"{_pct(sp['no_evidence'])} where the trace shows no evidence; "
            f"{_pct(sp['only_heavier_inference_or_none'])} with at most heavier inference"
        )
    ref = p["measures"]["spike_reference"]
    lines.append("evidence in the spike events' windows against its first-half base rate:")
    for name, r in ref.items():
        lines.append(
            f"  {name}: {r['with_evidence']} of {r['windows']}, "
            + ("—" if r["enrichment"] is None else f"{r['enrichment']:.1f}x")
        )
    lines.append(
        f"load {result['load_s']} s, import {p['import_s']} s, diagnose {p['diagnose_s']} s, "
        f"measure {p['measure_s']} s"
    )
    return "\n".join(lines)

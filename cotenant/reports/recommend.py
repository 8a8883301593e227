"""Recommendations derived from a week's numbers, each with the evidence behind it.

One rule per culprit that caused at least ``thresholds.min_victim_minutes`` victim-minutes or
was named in at least ``thresholds.min_incidents`` incidents (a repeat offender, even in a
short week such as the demo's), chosen by the kind of harm it did (its largest kind); each
carries its evidence and the expected gain (the victim-minutes it cost this week):

* ``cotenant`` by a model whose per-minute request count peaks at >= 3x its median: rate-limit
  it (token bucket); otherwise move it to another GPU than its victims';
* ``cotenant`` by a non-model process: cap it with MPS (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``)
  when its GPU spent >= 1 h SM-saturated, else move it off the GPU;
* ``bandwidth`` on DRAM: partition the GPU with MIG (MPS shares memory bandwidth); on PCIe:
  move the copy traffic to a GPU on another PCIe switch or pace it;
* ``lock``: fix the lock (its name in the evidence); ``throttle``: check cooling and power
  cap (hours throttled); ``memory``: cap the culprit's memory or move it; ``load``: rate-limit
  the model or add a replica; ``cpu``: give the host more cores or move the process;
  ``model_load``: keep the model's hot adapters resident or pre-warm them.

A week with no culprit over the thresholds gives none, and :func:`nothing_to_recommend` says
why in a sentence.
"""

from __future__ import annotations

from cotenant.reports.summary import CulpritImpact, Recommendation, Thresholds, WeekSummary

BURSTY = 3.0
SATURATED_H = 1.0


def recommend(s: WeekSummary) -> list[Recommendation]:
    out: list[Recommendation] = []
    minutes = {(c.model, c.kind): c.minutes for c in s.causes}
    by_model = {m.model: m for m in s.models}
    gpus = {g.gpu: g for g in s.gpus}
    for c in s.culprits:
        if not _earns(c, s.thresholds):
            continue
        kind = c.main_kind
        ev: dict[str, object] = {
            "culprit": c.culprit,
            "victim_minutes": round(c.victim_minutes, 1),
            "victims": c.victims,
            "incidents": c.incidents,
            "gpus": c.gpus,
            "kind": kind,
            "expected_gain": f"up to {c.victim_minutes:.1f} victim-minutes a week "
            f"({', '.join(c.victims)} back to their baselines)",
        }
        harm = (
            f"{c.culprit} caused {c.victim_minutes:.0f} victim-minutes ({kind}) to "
            f"{', '.join(c.victims)} in {c.incidents} incident(s) on {', '.join(c.gpus)}"
        )
        gpu = c.gpus[0] if c.gpus else ""
        if kind == "cotenant" and c.culprit_type == "model":
            m = by_model.get(c.culprit)
            burst = m.peak_to_median_rate if m else None
            ev["peak_to_median_rate"] = None if burst is None else round(burst, 2)
            if burst is not None and burst >= BURSTY:
                out.append(
                    Recommendation(
                        f"Rate-limit {c.culprit}",
                        "rate_limit",
                        c.culprit,
                        f"{harm}; its request rate peaks at {burst:.1f}x its median",
                        ev,
                    )
                )
            else:
                out.append(
                    Recommendation(f"Move {c.culprit} off {gpu}", "move", c.culprit, harm, ev)
                )
        elif kind == "cotenant":
            sat = gpus[gpu].sm_saturated_h if gpu in gpus else 0.0
            ev["sm_saturated_h"] = round(sat, 1)
            if sat >= SATURATED_H:
                out.append(
                    Recommendation(
                        f"Run {gpu} under MPS with a thread cap for {c.culprit}",
                        "mps",
                        gpu,
                        f"{harm}; {gpu} was SM-saturated {sat:.1f} h "
                        "(cap it with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)",
                        ev,
                    )
                )
            else:
                out.append(
                    Recommendation(f"Move {c.culprit} off {gpu}", "move", c.culprit, harm, ev)
                )
        elif kind == "bandwidth":
            if c.resource == "pcie":
                sat = gpus[gpu].pcie_saturated_h if gpu in gpus else 0.0
                ev["pcie_saturated_h"] = round(sat, 1)
                out.append(
                    Recommendation(
                        f"Move {c.culprit}'s copies off {gpu}'s PCIe link or pace them",
                        "move",
                        c.culprit,
                        f"{harm}; PCIe was saturated {sat:.1f} h",
                        ev,
                    )
                )
            else:
                sat = gpus[gpu].dram_saturated_h if gpu in gpus else 0.0
                ev["dram_saturated_h"] = round(sat, 1)
                out.append(
                    Recommendation(
                        f"Partition {gpu} with MIG to isolate {c.culprit}'s memory bandwidth",
                        "mig",
                        gpu,
                        f"{harm}; DRAM bandwidth was saturated {sat:.1f} h "
                        "(MPS does not isolate memory bandwidth)",
                        ev,
                    )
                )
        elif kind == "throttle":
            thr = gpus[c.culprit].throttled_h if c.culprit in gpus else 0.0
            ev["throttled_h"] = round(thr, 1)
            out.append(
                Recommendation(
                    f"Check cooling and power cap of {c.culprit}",
                    "cooling",
                    c.culprit,
                    f"{harm}; it was throttled (thermal/power) {thr:.1f} h",
                    ev,
                )
            )
        elif kind == "lock":
            out.append(
                Recommendation(
                    f"Move lock {c.culprit} out of the hot path",
                    "fix_lock",
                    c.culprit,
                    f"{harm}; requests waited on it (hold it shorter, shard it, or give "
                    "each model its own)",
                    ev,
                )
            )
        elif kind == "memory":
            full = gpus[gpu].memory_full_h if gpu in gpus else 0.0
            ev["memory_full_h"] = round(full, 1)
            out.append(
                Recommendation(
                    f"Cap {c.culprit}'s GPU memory or move it off {gpu}",
                    "memory",
                    c.culprit,
                    f"{harm}; {gpu} was near memory-full {full:.1f} h",
                    ev,
                )
            )
        elif kind == "load":
            own = minutes.get((c.culprit, "load"), c.victim_minutes)
            out.append(
                Recommendation(
                    f"Rate-limit {c.culprit} or add a replica",
                    "rate_limit",
                    c.culprit,
                    f"its own load surges cost it {own:.0f} minutes over its latency baseline",
                    ev,
                )
            )
        elif kind == "model_load":
            own = minutes.get((c.culprit, "model_load"), c.victim_minutes)
            out.append(
                Recommendation(
                    f"Keep {c.culprit}'s hot adapters resident or pre-warm them",
                    "prewarm",
                    c.culprit,
                    f"waiting for its own model and adapter loads cost it {own:.0f} minutes "
                    "over its latency baseline (loads slower or more frequent than usual: "
                    "a larger adapter cache, pinning the most used ones, or loading them "
                    "before traffic needs them)",
                    ev,
                )
            )
        elif kind == "cpu":
            out.append(
                Recommendation(
                    f"Give the host more CPU or move {c.culprit}", "cpu", c.culprit, harm, ev
                )
            )
    return out


def _earns(c: CulpritImpact, t: Thresholds) -> bool:
    return c.victim_minutes >= t.min_victim_minutes or c.incidents >= t.min_incidents


def nothing_to_recommend(s: WeekSummary) -> str:
    """Why a week has no recommendation, in one sentence."""
    t = s.thresholds
    if not s.culprits:
        if s.totals.incidents:
            return "None: this week's incidents named no culprit (their causes were unknown)."
        return "None: no incident this week, nothing calls for a change."
    top = max(s.culprits, key=lambda c: c.victim_minutes)
    return (
        f"None: no culprit hurt other models for {t.min_victim_minutes:g} victim-minutes or "
        f"in {t.min_incidents} incidents this week; the most was {top.culprit} "
        f"({top.victim_minutes:.1f} victim-minutes in {top.incidents} incident(s))."
    )

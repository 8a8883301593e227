"""The weekly report's week, reduced inside Prometheus: :class:`store.week_rollups.WeekRollups`
in PromQL over the recording rules of ``rules/fleet.rules.yml`` (:mod:`alerts.rules.fleet`).

A fleet's week is ~10^4 minutes of thousands of series; what the report keeps of it is a few
numbers per model and per GPU. So each of those numbers is one instant query whose answer is
a row per model or GPU, and no minute leaves Prometheus:

* **plain range functions** over the per-model minute series, which the rules record only in
  minutes that hold something (``cotenant:model_requests:increase_minute`` only with requests,
  the ``p99_max_minute`` series only where a p99 exists): ``count_over_time`` is the minutes
  with requests, ``max_over_time`` / ``quantile_over_time(0.5, …)`` the burst, ``sum_over_time``
  the totals — each reads every sample once;
* **subqueries at a 60 s step** where a minute must be compared with a threshold (SLO minutes,
  saturated GPU hours, co-tenancy): ``count_over_time((<minute> <= x)[range:1m])``.

Which sample is which minute. A rule records the clock minute ``[m, m + 60 s)`` once during
the next minute, at ``r`` in ``[m + 60 s, m + 120 s)`` (:func:`alerts.rules.fleet.minute_of`),
at any millisecond of it (the group's offset). A range function evaluated at
``hi + 60 s - 1 ms`` over the window ``(lo + 60 s - 1 ms, hi + 60 s - 1 ms]`` holds the samples
of minutes ``[lo, hi)``. A subquery step ``t`` (a multiple of 60 s) reads
``last_over_time(x[1m] offset 1ms)``: the one sample in ``(t - 60 s - 1 ms, t - 1 ms]``, the
minute ``t - 120 s``, and nothing where that minute has none (a plain selector would repeat the
last value for Prometheus' 5-minute lookback); a subquery over ``hi - lo`` evaluated at
``hi + 120 s - 1 ms`` steps through minutes ``[lo, hi)``. Range windows are open on the left in
Prometheus 3 and closed in Prometheus 2, so a window is 1 ms shorter on an engine whose windows
are closed — found once by asking it (:meth:`PromQLWeekRollups.closed_windows`) — or a sample
recorded on the window's first millisecond would count in two minutes.

Minute counts are read a day per subquery and added up: a subquery holds all its steps of
every series it selects at once, under Prometheus' ``--query.max-samples``. Queries run a few
at a time (``workers``), each under ``[prometheus] report_timeout_s``.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, overload

from cotenant.collectors.prometheus import promql
from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.slos import SloTable
from cotenant.core.week_reads import GpuThresholds

MINUTE_NS = 60_000_000_000
MS_NS = 1_000_000
DAY_NS = 1440 * MINUTE_NS
THROTTLED_BIT = 0x40
"""``cotenant:gpu_throttled:max_minute`` is 1 while a thermal or power clock-event reason was
active (which one is not kept): it stands for these reasons, counted when the report's
throttle bits include this one (HW thermal slowdown)."""
PROCESS_SM_MIN = 0.01
"""The report counts a process as a tenant from 1 % SM in a minute."""

M_REQUESTS = "cotenant:model_requests:increase_minute"
M_ERRORS = "cotenant:model_request_errors:increase_minute"
M_P99 = {
    "e2e": "cotenant:model_request_latency_seconds:p99_max_minute",
    "ttft": "cotenant:model_time_to_first_token_seconds:p99_max_minute",
    "tpot": "cotenant:model_time_per_output_token_seconds:p99_max_minute",
}
REQUESTS = "cotenant:requests:increase_minute"
LATENCY_SUM = "cotenant:request_latency_seconds:sum_minute"
PHASE = "cotenant:request_phase_seconds:sum_minute"
P99 = "cotenant:request_latency_seconds:p99_minute"
GPU = {
    "sm": "cotenant:gpu_sm_utilization:avg_minute",
    "dram": "cotenant:gpu_memory_bandwidth_utilization:avg_minute",
    "pcie": "cotenant:gpu_pcie_bytes_per_second:avg_minute",
    "used": "cotenant:gpu_memory_used_bytes:max_minute",
    "total": "cotenant:gpu_memory_total_bytes:max_minute",
    "throttled": "cotenant:gpu_throttled:max_minute",
}
TENANTS = "cotenant:gpu_tenants:count_minute"
PROCESS_SM = 'cotenant:process_sm_utilization:avg_minute{model=""}'

Answer = list[tuple[dict[str, str], float]]


def models_selector(models: list[str], *, negate: bool = False) -> str:
    """``{model=~"a|b"}`` (``!~`` with ``negate``) matching exactly these names."""
    rx = "|".join(re.escape(m) for m in sorted(models))
    return "{model" + ("!~" if negate else "=~") + promql.quote(rx) + "}"


def _ceil_minute(ns: int) -> int:
    return -(-ns // MINUTE_NS) * MINUTE_NS


class PromQLWeekRollups:
    """:class:`store.week_rollups.WeekRollups` over ``source``'s recording rules. Every method
    raises :class:`store.errors.SourceError` when Prometheus cannot answer (the report then
    fails, saying so)."""

    def __init__(self, source: PrometheusSource, workers: int = 4, chunk_ns: int = DAY_NS) -> None:
        """``workers``: queries in flight at once; ``chunk_ns``: the span of each subquery
        counting minutes (a day; whole minutes, at least one)."""
        self._source = source
        self._workers = max(1, workers)
        self._chunk = max(MINUTE_NS, chunk_ns - chunk_ns % MINUTE_NS)
        self._closed: bool | None = None

    def closed_windows(self) -> bool:
        """Whether the engine's range windows include their first millisecond (Prometheus 2)
        or not (Prometheus 3): a 2-minute subquery at a 1-minute step, evaluated on a whole
        minute, holds 3 points in a closed window and 2 in an open one. Asked once."""
        if self._closed is None:
            at = (time.time_ns() // MINUTE_NS - 1) * MINUTE_NS
            got = self._source.instant("count_over_time(vector(1)[2m:1m])", at)
            self._closed = bool(got) and got[0][1] > 2.5
        return self._closed

    def _width(self, ns: int) -> str:
        """A range of ``ns`` as the engine needs it to hold exactly ``ns`` of samples."""
        return promql.duration(max(ns - (MS_NS if self.closed_windows() else 0), MS_NS))

    def minute(self, series: str, sel: str = "") -> str:
        """``series``' sample of the minute a 60 s subquery step stands for (the module)."""
        return f"last_over_time({series}{sel}[{self._width(MINUTE_NS)}] offset 1ms)"

    # -- where to evaluate ---------------------------------------------------------------

    @staticmethod
    def _span(lo: int, hi: int) -> tuple[int, int]:
        """The minutes starting in ``[lo, hi)``, as whole-minute bounds."""
        a, b = _ceil_minute(lo), _ceil_minute(hi)
        return a, max(a, b)

    def _raw(self, lo: int, hi: int) -> tuple[str, int]:
        """(range, evaluation time) of a range function over the minutes' samples."""
        a, b = self._span(lo, hi)
        return self._width(b - a), b + MINUTE_NS - MS_NS

    def _sub(self, lo: int, hi: int) -> tuple[str, int]:
        """(range, evaluation time) of a 60 s subquery stepping through the minutes."""
        a, b = self._span(lo, hi)
        return self._width(b - a), b + 2 * MINUTE_NS - MS_NS

    def _minutes_where(self, name: str, cond: str, lo: int, hi: int) -> dict[str, tuple[str, int]]:
        """Queries counting the minutes of ``[lo, hi)`` where ``cond`` (an expression over
        :meth:`minute` selections) holds, a chunk (a day) each (``name#0``, ``name#1``, …;
        their sum is the count): a subquery holds all its steps of every series it selects at
        once, and Prometheus refuses a query over ``--query.max-samples`` (50 M) — a week of
        2,048 models' minutes is 41 M, a day's 6 M."""
        a, b = self._span(lo, hi)
        out = {}
        for i, d in enumerate(range(a, b, self._chunk)):
            rng, at = self._sub(d, min(d + self._chunk, b))
            out[f"{name}#{i}"] = (f"count_over_time(({cond})[{rng}:1m])", at)
        return out

    def _ask(self, queries: Mapping[str, tuple[str, int]]) -> dict[str, Answer]:
        """Each named ``(query, at_ns)``, a few at a time."""
        if not queries:
            return {}
        names = list(queries)
        with ThreadPoolExecutor(min(self._workers, len(names))) as pool:
            answers = pool.map(lambda n: self._source.instant(*queries[n]), names)
            return dict(zip(names, answers, strict=True))

    def _counts_within(
        self, name: str, series: str, slos: SloTable, lo: int, hi: int
    ) -> dict[str, tuple[str, int]]:
        """Queries counting, per model, the minutes whose ``series`` is within the model's
        SLO: one per distinct SLO value, and one for the models under the default (keys
        ``name…#chunk``)."""
        out: dict[str, tuple[str, int]] = {}
        groups = [(v, models_selector(ms)) for v, ms in slos.groups()]
        if slos.default > 0:
            named = list(slos.explicit)
            groups.append((slos.default, models_selector(named, negate=True) if named else ""))
        for i, (v, sel) in enumerate(groups):
            cond = f"{self.minute(series, sel)} <= {v / 1e3!r}"
            out |= self._minutes_where(f"{name}{i}", cond, lo, hi)
        return out

    # -- WeekRollups ---------------------------------------------------------------------

    def model_weeks(
        self, lo: int, hi: int, slos: SloTable, *, detail: bool = True
    ) -> dict[str, dict[str, Any]]:
        rng, at = self._raw(lo, hi)
        queries = {
            "requests": (f"sum_over_time({M_REQUESTS}[{rng}])", at),
            "minutes": (f"count_over_time({M_REQUESTS}[{rng}])", at),
            **self._counts_within("met", M_P99["e2e"], slos, lo, hi),
        }
        if detail:
            queries |= {
                "errors": (f"sum_over_time({M_ERRORS}[{rng}])", at),
                "busiest": (f"max_over_time({M_REQUESTS}[{rng}])", at),
                "median": (f"quantile_over_time(0.5, {M_REQUESTS}[{rng}])", at),
            }
        got = {k: _by_model(v) for k, v in self._ask(queries).items()}
        met = _summed(got, "met")
        out: dict[str, dict[str, Any]] = {}
        for m in sorted(set(got["requests"]) | set(got["minutes"])):
            busiest, median = got.get("busiest", {}).get(m), got.get("median", {}).get(m)
            out[m] = {
                "requests": round(got["requests"].get(m, 0.0)),
                "errors": round(got.get("errors", {}).get(m, 0.0)),
                "minutes": round(got["minutes"].get(m, 0.0)),
                "met": round(met.get(m, 0.0)) if slos.of(m) is not None else 0,
                "burst": busiest / median if busiest is not None and median else None,
            }
        return out

    def token_slo_weeks(
        self, lo: int, hi: int, slo_ms: Mapping[str, Mapping[str, float]]
    ) -> list[dict[str, Any]]:
        names = sorted(set(slo_ms.get("ttft", {})) | set(slo_ms.get("tpot", {})))
        if not names:
            return []
        rng, at = self._raw(lo, hi)
        queries: dict[str, tuple[str, int]] = {}
        for ind in ("ttft", "tpot"):
            series = M_P99[ind]
            queries[f"{ind}:minutes"] = (
                f"count_over_time({series}{models_selector(names)}[{rng}])",
                at,
            )
            slos = SloTable({k: float(v) for k, v in slo_ms.get(ind, {}).items()})
            queries |= self._counts_within(f"{ind}:met", series, slos, lo, hi)
        got = {k: _by_model(v) for k, v in self._ask(queries).items()}
        rows = []
        for m in names:
            row: dict[str, Any] = {"model": m}
            for ind in ("ttft", "tpot"):
                row[f"{ind}_minutes"] = round(got[f"{ind}:minutes"].get(m, 0.0))
                row[f"{ind}_met"] = round(_summed(got, f"{ind}:met").get(m, 0.0))
            if row["ttft_minutes"] + row["tpot_minutes"] > 0:
                rows.append(row)
        return rows

    def gpu_weeks(self, lo: int, hi: int, t: GpuThresholds) -> list[dict[str, Any]]:
        rng, at = self._raw(lo, hi)
        m = self.minute
        conds = {
            "sm_h": f"{m(GPU['sm'])} >= {t.sm / 100.0!r}",
            "dram_h": f"{m(GPU['dram'])} >= {t.dram!r}",
            "pcie_h": f"{m(GPU['pcie'])} >= {t.pcie_bps!r}",
            "memory_full_h": (
                f"{m(GPU['used'])} >= on (host, gpu) {t.memory_full!r} * {m(GPU['total'])}"
            ),
            "cotenancy_h": f"{m(TENANTS)} >= 2",
        }
        if t.throttle_bits & THROTTLED_BIT:
            conds["throttled_h"] = f"{m(GPU['throttled'])} > 0"
        queries = {
            "sampled": (
                f"count_over_time({GPU['sm']}[{rng}]) or count_over_time({GPU['used']}[{rng}])",
                at,
            ),
            "models": (f"group by (gpu, model) (max_over_time({REQUESTS}[{rng}]) > 0)", at),
            "processes": (
                f"group by (gpu, process) "
                f"(max_over_time({PROCESS_SM}[{rng}]) > {PROCESS_SM_MIN!r})",
                at,
            ),
        }
        for k, cond in conds.items():
            queries |= self._minutes_where(k, cond, lo, hi)
        got = self._ask(queries)
        hours = {
            k: {key: v / 60.0 for key, v in _summed(got, k, ("host", "gpu")).items()}
            for k in ("sm_h", "dram_h", "pcie_h", "throttled_h", "memory_full_h")
        }
        co = _summed(got, "cotenancy_h", ("gpu",))
        names: dict[str, dict[str, set[str]]] = {}
        for key, label in (("models", "model"), ("processes", "process")):
            for lb, _ in got[key]:
                names.setdefault(lb.get("gpu", ""), {}).setdefault(key, set()).add(
                    lb.get(label, "")
                )
        rows = []
        sampled = _summed(got, "sampled", ("host", "gpu"))
        for (host, gpu), n in sorted(sampled.items(), key=lambda kv: kv[0][::-1]):
            g = names.get(gpu, {})
            rows.append(
                {
                    "gpu": gpu,
                    "host": host or None,
                    "hours_sampled": n / 60.0,
                    **{k: v.get((host, gpu), 0.0) for k, v in hours.items()},
                    "models": sorted(g.get("models", ())),
                    "processes": sorted(g.get("processes", ())),
                    "cotenancy_h": co.get((gpu,), 0.0) / 60.0,
                }
            )
        return rows

    def p99_estimate(self, model: str, lo: int, hi: int) -> float | None:
        srng, sat = self._sub(lo, hi)
        sel = "{model=" + promql.quote(model) + "}"
        p99 = f"({self.minute(P99, sel)} >= 0)"
        n = f"sum by (model, gpu) ({self.minute(REQUESTS, sel)})"
        q = (
            f"sum(sum_over_time(({p99} * on (model, gpu) {n})[{srng}:1m]))"
            f" / sum(sum_over_time(({n} and on (model, gpu) {p99})[{srng}:1m]))"
        )
        got = self._source.instant(q, sat)
        v = got[0][1] if got else math.nan
        return v * 1e3 if math.isfinite(v) else None

    def load_wait_weeks(self, lo: int, hi: int) -> list[dict[str, Any]]:
        rng, at = self._raw(lo, hi)
        got = {
            k: _by_model(v)
            for k, v in self._ask(
                {
                    "wait": (
                        f'sum by (model) (sum_over_time({PHASE}{{phase="other"}}[{rng}]))',
                        at,
                    ),
                    "requests": (f"sum by (model) (sum_over_time({REQUESTS}[{rng}]))", at),
                    "latency": (f"sum by (model) (sum_over_time({LATENCY_SUM}[{rng}]))", at),
                }
            ).items()
        }
        rows = [
            {
                "model": m,
                "requests": round(got["requests"].get(m, 0.0)),
                "latency_ms": got["latency"].get(m, 0.0) * 1e3,
                "wait_ms": w * 1e3,
            }
            for m, w in got["wait"].items()
            if w > 0
        ]
        return sorted(rows, key=lambda r: (-r["wait_ms"], r["model"]))

    def load_weeks(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """Empty: agents export the requests' load waits (the ``other`` phase), not each load,
        so a fleet's week has no per-load series (the report says so)."""
        return []


def _by_model(answer: Answer) -> dict[str, float]:
    return {lb.get("model", ""): v for lb, v in answer if math.isfinite(v)}


@overload
def _summed(got: Mapping[str, Mapping[str, float]], name: str) -> dict[str, float]: ...


@overload
def _summed(
    got: Mapping[str, Answer], name: str, by: tuple[str, ...]
) -> dict[tuple[str, ...], float]: ...


def _summed(
    got: Mapping[str, Any], name: str, by: tuple[str, ...] | None = None
) -> dict[Any, float]:
    """The answers of ``name`` and of its chunks (``name#0``, ``name…#1``: every key that is
    ``name`` or starts with it and has a ``#`` after it) added up: per model (answers already
    by model) or per ``by`` labels."""
    out: dict[Any, float] = {}
    for k, answer in got.items():
        if not (k == name or (k.startswith(name) and "#" in k[len(name) :])):
            continue
        items = (
            answer.items()
            if by is None
            else ((tuple(lb.get(b, "") for b in by), v) for lb, v in answer)
        )
        for key, v in items:
            if math.isfinite(v):
                out[key] = out.get(key, 0.0) + v
    return out

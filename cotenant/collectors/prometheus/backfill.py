"""A store's per-minute rollups as the minute series a fleet's Prometheus records, in
OpenMetrics, for ``promtool tsdb create-blocks-from openmetrics``.

Fleet mode reads a week through the recording rules of ``rules/fleet.rules.yml``
(:mod:`alerts.rules.fleet`, :mod:`collectors.prometheus.week`): one sample per clock minute,
recorded during the next minute. This writes those samples from an embedded store's rollup
tables, so an imported or recorded history (e.g. ``cotenant import-gentd26``) can be backfilled
into a real Prometheus and read by the fleet's report: each minute ``m``'s sample is stamped
``m + 90 s``, inside the minute the rules would record it in. Series and units as the rules
record them: seconds, ratios (``sm_util`` / 100), bytes; per (model, GPU) and per model; per
GPU; per GPU process; the GPU's tenants. The request series carry no ``node`` label (a
rollup keeps no host per request); the per-kind ``model_loads`` have no fleet series (the fleet
keeps the requests' load waits, the ``other`` phase). Reads the store through
:func:`store.queries.rollup_minutes`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cotenant.core.phases import PHASES
from cotenant.core.timerange import TimeRange
from cotenant.store.db import Store
from cotenant.store.queries import rollup_minutes

MINUTE_NS = 60_000_000_000
STAMP_NS = 90_000_000_000
"""A minute's sample lies this long after the minute's start (mid-way through the next)."""
THROTTLE_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
"""NVML clock-event reasons the rules count as throttling (SW power cap, HW slowdown, SW
thermal, HW thermal, HW power brake; ``alerts.rules.cotenant.THROTTLE_REASONS``)."""

TOKEN_P99 = (("ttft_p99_ms", "time_to_first_token"), ("tpot_p99_ms", "time_per_output_token"))
"""Rollup column -> recorded name of the generative models' p99s."""

Sample = tuple[str, int, float]  # (series with labels, minute ns, value)


def _series(name: str, labels: dict[str, Any]) -> str:
    def esc(v: Any) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    body = ",".join(f'{k}="{esc(v)}"' for k, v in labels.items() if v not in (None, ""))
    return f"{name}{{{body}}}"


def _num(x: Any) -> float | None:
    return None if x is None else float(x)


def _requests(rows: list[dict[str, Any]], out: dict[str, list[Sample]]) -> None:
    per_model: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        m, lb = int(r["minute_ns"]), {"model": r["model"], "gpu": r["gpu"]}
        n = float(r["count"] or 0)

        def add(name: str, v: float | None, labels: dict[str, Any] = lb, m: int = m) -> None:
            if v is not None:
                out[name].append((_series(name, labels), m, v))

        add("cotenant:requests:increase_minute", n)
        add("cotenant:request_errors:increase_minute", float(r["errors"] or 0))
        add("cotenant:request_latency_seconds:sum_minute", (_num(r["latency_sum_ms"]) or 0) / 1e3)
        for q in ("p50", "p90", "p95", "p99"):
            v = _num(r[f"{q}_ms"])
            add(f"cotenant:request_latency_seconds:{q}_minute", None if v is None else v / 1e3)
        for col, name in TOKEN_P99:
            v = _num(r.get(col))
            add(f"cotenant:{name}_seconds:p99_minute", None if v is None else v / 1e3)
        for p in PHASES:
            v = _num(r[f"{p}_ms"])
            if v is not None:
                add(
                    "cotenant:request_phase_seconds:sum_minute",
                    v * n / 1e3,
                    {**lb, "phase": p},
                )
        per_model[(m, str(r["model"]))].append(r)
    for (m, model), rs in per_model.items():
        lb = {"model": model}
        n = sum(float(r["count"] or 0) for r in rs)
        errors = sum(float(r["errors"] or 0) for r in rs)
        pairs: list[tuple[str, float | None]] = [
            ("cotenant:model_requests:increase_minute", n if n > 0 else None),
            ("cotenant:model_request_errors:increase_minute", errors if errors > 0 else None),
        ]
        for col, name in (("p99_ms", "request_latency"), *TOKEN_P99):
            vals = [float(r[col]) for r in rs if r.get(col) is not None]
            pairs.append(
                (f"cotenant:model_{name}_seconds:p99_max_minute", max(vals) / 1e3 if vals else None)
            )
        for name, v in pairs:
            if v is not None:
                out[name].append((_series(name, lb), m, v))


def _gpus(rows: list[dict[str, Any]], out: dict[str, list[Sample]]) -> None:
    for r in rows:
        m, lb = int(r["minute_ns"]), {"host": r["host"], "gpu": r["gpu"]}
        sm, mem, dram = _num(r["sm_util"]), _num(r["mem_util"]), _num(r["dram_active"])
        tx, rx = _num(r["pcie_tx_bps"]), _num(r["pcie_rx_bps"])
        clk, top = _num(r["sm_clock_mhz_min"]), _num(r["max_sm_clock_mhz"])
        reasons = r["clock_event_reasons"]
        pairs: list[tuple[str, float | None]] = [
            ("cotenant:gpu_sm_utilization:avg_minute", None if sm is None else sm / 100),
            (
                "cotenant:gpu_memory_bandwidth_utilization:avg_minute",
                dram if dram is not None else (None if mem is None else mem / 100),
            ),
            (
                "cotenant:gpu_pcie_bytes_per_second:avg_minute",
                None if tx is None and rx is None else (tx or 0.0) + (rx or 0.0),
            ),
            ("cotenant:gpu_memory_used_bytes:max_minute", _num(r["mem_used_bytes_max"])),
            ("cotenant:gpu_memory_total_bytes:max_minute", _num(r["mem_total_bytes"])),
            (
                "cotenant:gpu_throttled:max_minute",
                None if reasons is None else float(bool(int(reasons) & THROTTLE_BITS)),
            ),
            ("cotenant:gpu_power_watts:avg_minute", _num(r["power_w"])),
            (
                "cotenant:gpu_sm_clock_ratio:min_minute",
                clk / top if clk is not None and top else None,
            ),
        ]
        for name, v in pairs:
            if v is not None:
                out[name].append((_series(name, lb), m, v))


def _processes(rows: list[dict[str, Any]], out: dict[str, list[Sample]]) -> None:
    for r in rows:
        m = int(r["minute_ns"])
        lb = {
            "host": r["host"],
            "gpu": r["gpu"],
            "pid": "" if r["pid"] is None else str(r["pid"]),
            "process": r["process_name"],
            "model": r["model"],
        }
        sm, used, cpu = _num(r["sm_util"]), _num(r["mem_used_bytes_max"]), _num(r["cpu_cores"])
        if r["gpu"] is not None:
            for name, v in (
                ("cotenant:process_sm_utilization:avg_minute", None if sm is None else sm / 100),
                ("cotenant:process_memory_used_bytes:max_minute", used),
            ):
                if v is not None:
                    out[name].append((_series(name, lb), m, v))
        if cpu is not None:
            name = "cotenant:process_cpu_cores:avg_minute"
            out[name].append((_series(name, {k: v for k, v in lb.items() if k != "gpu"}), m, cpu))


def _tenants(
    req: list[dict[str, Any]], proc: list[dict[str, Any]], out: dict[str, list[Sample]]
) -> None:
    names: dict[tuple[int, str], set[str]] = defaultdict(set)
    for r in req:
        if (r["count"] or 0) > 0:
            names[(int(r["minute_ns"]), str(r["gpu"]))].add(str(r["model"]))
    for r in proc:
        if r["gpu"] is not None and r["model"] is None and (_num(r["sm_util"]) or 0) > 1:
            names[(int(r["minute_ns"]), str(r["gpu"]))].add(str(r["process_name"]))
    name = "cotenant:gpu_tenants:count_minute"
    for (m, gpu), ts in names.items():
        out[name].append((_series(name, {"gpu": gpu}), m, float(len(ts))))


def recorded_samples(store: Store, rng: TimeRange) -> dict[str, list[Sample]]:
    """Per recorded series name, its samples of the minutes of ``rng``: what the fleet rules
    would have recorded had the rows been scraped."""
    out: dict[str, list[Sample]] = defaultdict(list)
    req = rollup_minutes(store, "request_rollup_1m", rng).to_pylist()
    proc = rollup_minutes(store, "process_rollup_1m", rng).to_pylist()
    _requests(req, out)
    _gpus(rollup_minutes(store, "gpu_rollup_1m", rng).to_pylist(), out)
    _processes(proc, out)
    _tenants(req, proc, out)
    return out


def openmetrics_lines(samples: dict[str, list[Sample]]) -> Iterator[str]:
    """The samples as OpenMetrics text: one gauge family per name, each series' samples in
    time order, ``# EOF`` last (what ``promtool tsdb create-blocks-from openmetrics`` reads)."""
    for name in sorted(samples):
        yield f"# TYPE {name} gauge\n"
        for series, m, v in sorted(samples[name], key=lambda s: (s[0], s[1])):
            yield f"{series} {v!r} {(m + STAMP_NS) // 1_000_000 / 1e3:.3f}\n"
    yield "# EOF\n"


def write_openmetrics(store: Store, path: Path | str, rng: TimeRange | None = None) -> int:
    """Write the recorded series of ``rng`` (default: every minute) to ``path``; returns the
    samples written."""
    samples = recorded_samples(store, rng or TimeRange())
    with Path(path).open("w", encoding="utf-8") as fh:
        fh.writelines(openmetrics_lines(samples))
    return sum(len(v) for v in samples.values())

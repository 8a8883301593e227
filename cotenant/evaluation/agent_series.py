"""What a ``cotenant agent`` would have exposed during a simulation, as timestamped OpenMetrics.

Central diagnosis reads agents through Prometheus; to score it on the scenario library (or to
backfill a fleet's history for a benchmark) without running agents in real time, this module
turns a simulation's tables into the samples Prometheus would have scraped every ``scrape_s``
seconds, for ``promtool tsdb create-blocks-from openmetrics``:

* ``cotenant_request_duration_seconds{node,model,gpu,phase}``: the total's buckets
  (:data:`collectors.fleet_histogram.TOTAL_BUCKETS_S`), ``_sum`` and ``_count`` of every
  phase (phases get the ``+Inf`` bucket only: central diagnosis reads phase means). A request
  counts from the first scrape at or after it completed, as the agent's counters do.
* ``cotenant_lock_waits_total`` / ``cotenant_lock_wait_seconds_total{node,model,gpu,lock,holder}``;
* the GPU counters under the DCGM names and labels the agent uses
  (:data:`collectors.nvml.metrics.DCGM_SERIES`) and under its own names
  (:data:`collectors.nvml.metrics.GPU_SERIES`, ``cotenant_gpu_clock_event_active``),
  per-process GPU ratios and memory, and host CPU per program: the newest sample at or
  before each scrape, as the agent's gauges show the latest poll;
* ``cotenant_request_errors_total{node,model,gpu}``;
* for generative models, the agent's token histograms
  (:data:`collectors.ingest_metrics.TOKEN_SERIES`: TTFT, TPOT, prompt and output tokens).

Vectorised per (model, GPU) and per series; one scenario of ten minutes is ~10^4 lines.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cotenant.collectors.fleet_histogram import NAME, TOTAL_BUCKETS_S
from cotenant.collectors.ingest_metrics import TOKEN_SERIES, token_values
from cotenant.collectors.nvml.metrics import CLOCK_EVENT_REASONS, DCGM_SERIES, GPU_SERIES
from cotenant.core.phases import PHASE_COLUMNS, PHASES

MIB = 1048576


def _lb(**labels: str) -> str:
    inner = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in labels.items()
    )
    return "{" + inner + "}"


def _series(name: str, labels: str, ts_s: np.ndarray, values: np.ndarray) -> Iterator[str]:
    for t, v in zip(ts_s.tolist(), values.tolist(), strict=True):
        if v == v:  # NaN: no sample
            yield f"{name}{labels} {v!r} {t:.3f}"


def _histogram(
    name: str,
    labels: dict[str, str],
    les: list[str],
    cum: np.ndarray,
    count: np.ndarray,
    sums: np.ndarray,
    ts_s: np.ndarray,
) -> list[str]:
    """One histogram's samples, a whole point (buckets, count, sum) per timestamp, as
    OpenMetrics requires. ``cum``: cumulative bucket counts, shape (scrapes, buckets)."""
    pre = [f"{name}_bucket{_lb(**labels, le=le)} " for le in les]
    lb = _lb(**labels)
    out: list[str] = []
    rows = cum.tolist()
    for i, (t, c, s) in enumerate(zip(ts_s.tolist(), count.tolist(), sums.tolist(), strict=True)):
        stamp = f" {t:.3f}"
        out += [f"{p}{v}{stamp}" for p, v in zip(pre, rows[i], strict=True)]
        out.append(f"{name}_count{lb} {c!r}{stamp}")
        out.append(f"{name}_sum{lb} {s!r}{stamp}")
    return out


def _cumulative(k: np.ndarray, v: np.ndarray, bounds: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    """Cumulative bucket counts (scrapes x buckets + 1), counts and sums per scrape of values
    ``v`` first seen at scrape ``k`` (``k < n``)."""
    b = np.searchsorted(bounds, v, side="left")
    counts = np.zeros((n, len(bounds) + 1), np.int64)
    np.add.at(counts, (k, b), 1)
    cum = counts.cumsum(axis=0).cumsum(axis=1)
    s = np.zeros(n)
    np.add.at(s, k, v)
    return cum, cum[:, -1].astype(np.float64), s.cumsum()


def _np(t: pa.Table, col: str) -> np.ndarray:
    return np.asarray(t.column(col).to_numpy(zero_copy_only=False), dtype=np.float64)


def scrape_times(t0_ns: int, t1_ns: int, scrape_s: float) -> np.ndarray:
    """Scrape instants (ns) from ``t0_ns`` through ``t1_ns``."""
    step = int(scrape_s * 1e9)
    return np.arange(t0_ns, t1_ns + 1, step, dtype=np.int64)


def request_families(
    requests: pa.Table, node: str, scrapes: np.ndarray
) -> Iterator[tuple[str, str, list[str]]]:
    """(family, type, lines) of the latency histogram and the lock counters."""
    ts_s = scrapes / 1e9
    bounds = np.asarray(TOTAL_BUCKETS_S)
    les = [*(repr(float(b)) for b in TOTAL_BUCKETS_S), "+Inf"]
    hist: list[str] = []
    tokens: dict[str, list[str]] = {}
    waits: list[str] = []
    secs: list[str] = []
    errors: list[str] = []
    n = len(scrapes)
    keys = pc.binary_join_element_wise(
        pc.fill_null(requests["model"], ""), pc.fill_null(requests["gpu"], ""), "\x00"
    )
    end = requests["ts_end_ns"].to_numpy(zero_copy_only=False)
    # the scrape that first sees each request
    k_all = np.searchsorted(scrapes, end, side="left")
    for key in pc.unique(keys).to_pylist():
        model, gpu = str(key).split("\x00", 1)
        sel = pc.equal(keys, key).to_numpy(zero_copy_only=False)
        k = k_all[sel]
        ok = k < n
        t = requests.filter(pa.array(sel))
        lat = np.nan_to_num(_np(t, "latency_ms")) / 1e3
        cum, total, _ = _cumulative(k[ok], lat[ok], bounds, n)
        base = {"node": node, "model": model, "gpu": gpu}
        for phase, col in (("total", "latency_ms"), *zip(PHASES, PHASE_COLUMNS, strict=True)):
            v = np.nan_to_num(_np(t, col)) / 1e3
            if phase != "total" and not (v > 0).any():
                continue
            s = np.zeros(n)
            np.add.at(s, k[ok], v[ok])
            hist += _histogram(NAME, {**base, "phase": phase},
                               les if phase == "total" else ["+Inf"],
                               cum if phase == "total" else total[:, None], total,
                               s.cumsum(), ts_s)  # fmt: skip
        # TTFT, TPOT and token counts of generative models, as the agent's TokenHistograms
        for (name, _, tb), v in zip(TOKEN_SERIES, token_values(t), strict=True):
            has = ok & np.isfinite(v)
            if has.any():
                c, cnt, sm = _cumulative(k[has], v[has], np.asarray(tb), n)
                les_t = [*(repr(float(b)) for b in tb), "+Inf"]
                tokens.setdefault(name, []).extend(
                    _histogram(name, {"model": model, "gpu": gpu}, les_t, c, cnt, sm, ts_s)
                )
        failed = pc.fill_null(pc.equal(t["status"], "error"), False).to_numpy(zero_copy_only=False)
        e = np.zeros(n)
        np.add.at(e, k[ok & failed], 1)
        errors += _series("cotenant_request_errors_total", _lb(**base), ts_s, e.cumsum())
        wait = np.nan_to_num(_np(t, "lock_wait_ms")) / 1e3
        if (wait > 0).any():
            names = np.asarray(pc.fill_null(t["lock_name"], "").to_pylist(), dtype=object)
            holders = np.asarray(pc.fill_null(t["lock_holder"], "").to_pylist(), dtype=object)
            pairs = zip(names, holders, wait, strict=True)
            for lock, holder in sorted({(a, h) for a, h, w in pairs if w > 0}):
                m = (names == lock) & (holders == holder) & (wait > 0) & ok
                c = np.zeros(n)
                w_ = np.zeros(n)
                np.add.at(c, k[m], 1)
                np.add.at(w_, k[m], wait[m])
                labels = _lb(**base, lock=lock, holder=holder)
                waits += _series("cotenant_lock_waits_total", labels, ts_s, c.cumsum())
                secs += _series("cotenant_lock_wait_seconds_total", labels, ts_s, w_.cumsum())
    yield NAME, "histogram", hist
    for name, _, _ in TOKEN_SERIES:
        yield name, "histogram", tokens.get(name, [])
    yield "cotenant_request_errors", "counter", errors
    yield "cotenant_lock_waits", "counter", waits
    yield "cotenant_lock_wait_seconds", "counter", secs


def _latest(ts: np.ndarray, values: np.ndarray, scrapes: np.ndarray) -> np.ndarray:
    """The newest value at or before each scrape (NaN before the first sample)."""
    order = np.argsort(ts, kind="stable")
    ts, values = ts[order], values[order]
    i = np.searchsorted(ts, scrapes, side="right") - 1
    out = np.where(i >= 0, values[np.clip(i, 0, None)], np.nan)
    return np.asarray(out, dtype=np.float64)


def gauge_families(
    gpu_samples: pa.Table, process_samples: pa.Table, scrapes: np.ndarray
) -> Iterator[tuple[str, str, list[str]]]:
    """(family, type, lines) of the DCGM-named GPU gauges and the per-process gauges."""
    ts_s = scrapes / 1e9
    fams: dict[str, list[str]] = {name: [] for name, *_ in (*DCGM_SERIES, *GPU_SERIES)}
    fams["DCGM_FI_DEV_FB_FREE"] = []
    fams["cotenant_gpu_clock_event_active"] = []
    gpus = sorted(set(gpu_samples.column("gpu").to_pylist()) - {None})
    for index, gpu in enumerate(gpus):
        t = gpu_samples.filter(pc.equal(gpu_samples["gpu"], gpu))
        ts = t["ts_ns"].to_numpy()
        host = str(t["host"][0].as_py() or "")
        labels = _lb(gpu=str(index), UUID=str(gpu), device=f"nvidia{index}", Hostname=host)
        for name, col, scale, _ in DCGM_SERIES:
            fams[name] += _series(name, labels, ts_s, _latest(ts, _np(t, col) * scale, scrapes))
        own = _lb(host=host, gpu=str(gpu))  # the agent's NVML-named series
        for name, col, scale, _ in GPU_SERIES:
            fams[name] += _series(name, own, ts_s, _latest(ts, _np(t, col) * scale, scrapes))
        reasons = _latest(ts, _np(t, "clock_event_reasons"), scrapes)
        for reason, bit in CLOCK_EVENT_REASONS:
            active = np.where(
                np.isnan(reasons), np.nan, (np.nan_to_num(reasons).astype(np.int64) & bit) > 0
            )
            fams["cotenant_gpu_clock_event_active"] += _series(
                "cotenant_gpu_clock_event_active", _lb(host=host, gpu=str(gpu), reason=reason),
                ts_s, active.astype(np.float64),
            )  # fmt: skip
        free = (_np(t, "mem_total_bytes") - _np(t, "mem_used_bytes")) / MIB
        fams["DCGM_FI_DEV_FB_FREE"] += _series(
            "DCGM_FI_DEV_FB_FREE", labels, ts_s, _latest(ts, free, scrapes)
        )
    for name, lines in fams.items():
        yield name, "gauge", lines
    proc = {
        "cotenant_gpu_process_sm_utilization_ratio": ("sm_util", 0.01),
        "cotenant_gpu_process_memory_utilization_ratio": ("mem_util", 0.01),
        "cotenant_gpu_process_memory_used_bytes": ("mem_used_bytes", 1.0),
    }
    out: dict[str, list[str]] = {name: [] for name in (*proc, "cotenant_process_cpu_cores")}
    t = process_samples
    if t.num_rows:
        keys = pc.binary_join_element_wise(
            *(pc.cast(pc.fill_null(pc.cast(t[c], pa.string()), ""), pa.string())
              for c in ("host", "gpu", "pid", "process_name", "model")),
            "\x00",
        )  # fmt: skip
        for key in pc.unique(keys).to_pylist():
            host, gpu, pid, pname, model = str(key).split("\x00")
            p = t.filter(pc.equal(keys, key))
            ts = p["ts_ns"].to_numpy()
            if gpu:
                labels = _lb(host=host, gpu=gpu, pid=pid, process=pname, model=model)
                for name, (col, scale) in proc.items():
                    v = _latest(ts, _np(p, col) * scale, scrapes)
                    out[name] += _series(name, labels, ts_s, v)
            cpu = _np(p, "cpu_cores")
            if np.isfinite(cpu).any():
                labels = _lb(host=host, pid=pid, process=pname, model=model)
                out["cotenant_process_cpu_cores"] += _series(
                    "cotenant_process_cpu_cores", labels, ts_s, _latest(ts, cpu, scrapes)
                )
    for name, lines in out.items():
        yield name, "gauge", lines


def agent_openmetrics(
    requests: pa.Table,
    gpu_samples: pa.Table,
    process_samples: pa.Table,
    *,
    node: str,
    t0_ns: int,
    t1_ns: int,
    scrape_s: float = 15.0,
) -> dict[str, list[str]]:
    """Family name -> ``# TYPE`` line and sample lines, for one agent over ``[t0, t1]``.
    Families of several agents are merged by the caller (:func:`write_openmetrics`)."""
    scrapes = scrape_times(t0_ns, t1_ns, scrape_s)
    out: dict[str, list[str]] = {}
    for name, typ, lines in (
        *request_families(requests, node, scrapes),
        *gauge_families(gpu_samples, process_samples, scrapes),
    ):
        out.setdefault(name, [f"# TYPE {name} {typ}"]).extend(lines)
    return out


def write_openmetrics(path: str, parts: list[dict[str, list[str]]]) -> int:
    """Write several agents' families as one OpenMetrics file (each family once, its series
    together, as the format requires); returns the sample lines written."""
    merged: dict[str, list[str]] = {}
    for part in parts:
        for name, lines in part.items():
            if name in merged:
                merged[name].extend(lines[1:])
            else:
                merged[name] = list(lines)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for lines in merged.values():
            f.write("\n".join(lines))
            f.write("\n")
            n += len(lines) - 1
        f.write("# EOF\n")
    return n

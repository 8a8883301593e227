"""Dashboard speed: 1 hour of 4 models x 200 rps (about 2.9M requests) behind the real app.

Goals: the Overview's first full render <= 1.5 s; any callback p95 <= 300 ms.

    .venv/bin/python bench/dashboard.py [--repeats 20] [--browser-loads 5] [--keep DIR]
        [--plotly-js plotly-cartesian.min.js]

Generates the hour straight into a DuckDB store file (vectorised: Poisson arrivals, a
latency decomposition per request, 1 Hz GPU and per-process counters, one injected co-tenant
spike on ``tts``), refreshes the per-minute rollups, diagnoses it into incidents, then runs
the real ``Service`` (default ``[store]`` settings: 128 MB, 1 thread) with its clock at the end
of the hour and measures

* every page's callbacks: HTTP POSTs to ``/_dash-update-component`` with the payloads the
  browser sends (built from ``/_dash-dependencies``), ``--repeats`` times each -> median, p95;
* the Overview's live refresh (a tick with the windows already drawn);
* the Overview's first full render in headless Chromium: navigation start until every
  callback has answered and the chart, the tiles and the incident list are drawn, on a first
  visit (a fresh browser: empty cache) and on a reload, side by side for the dashboard as it
  is, as it was (``eager_loading=True``: every script with the page) and, with
  ``--plotly-js``, serving that plotly.js bundle; the variants take turns, ``--browser-loads``
  rounds, medians.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cotenant.analysis.diagnose import diagnose
from cotenant.analysis.incidents import IncidentBook
from cotenant.app.config import load_config
from cotenant.app.service import Service
from cotenant.core.phases import PHASE_COLUMNS
from cotenant.core.timerange import TimeRange
from cotenant.store.db import Store
from cotenant.store.maintenance import Maintenance
from cotenant.store.schema import arrow_schema
from cotenant.store.source import StoreSource

HOUR_NS = 3_600_000_000_000
MODELS = (("tts", "gpu0"), ("embed", "gpu0"), ("chat", "gpu1"), ("rerank", "gpu1"))
SLO_MS = {"tts": 60.0, "embed": 60.0, "chat": 60.0, "rerank": 60.0}
SPIKE = (1800, 1920)  # seconds into the hour: embed bursts, tts computes 3x slower


def _requests(rng: np.random.Generator, start_ns: int, rate: float) -> pa.Table:
    schema = arrow_schema("requests")
    parts = []
    for pid, (model, gpu) in enumerate(MODELS):
        n = rng.poisson(rate * 3600)
        t0 = np.sort(rng.uniform(0, 3600, n))
        sec = t0.astype(np.int64)
        in_spike = (sec >= SPIKE[0]) & (sec < SPIKE[1])
        queue = rng.exponential(2.0, n)
        compute = rng.lognormal(np.log(8.0), 0.3, n)
        if model == "tts":
            compute[in_spike] *= 3.0
            queue[in_spike] *= 4.0
        pre, h2d, d2h, post = (rng.exponential(s, n) for s in (0.5, 0.3, 0.3, 0.4))
        lat = queue + pre + h2d + compute + d2h + post
        end = start_ns + (t0 * 1e9).astype(np.int64) + (lat * 1e6).astype(np.int64)
        zeros = np.zeros(n)
        cols: dict[str, Any] = {
            "ts_start_ns": start_ns + (t0 * 1e9).astype(np.int64),
            "ts_end_ns": end,
            "latency_ms": lat,
            "trace_id": pa.nulls(n, pa.string()),
            "span_id": pa.nulls(n, pa.string()),
            "model": pa.array([model] * n),
            "tenant": pa.array(["default"] * n),
            "host": pa.array(["bench"] * n),
            "pid": np.full(n, 1000 + pid),
            "gpu": pa.array([gpu] * n),
            "priority": np.zeros(n, dtype=np.int32),
            "batch_size": rng.integers(1, 9, n).astype(np.int32),
            "prompt_tokens": pa.nulls(n, pa.int32()),
            "output_tokens": pa.nulls(n, pa.int32()),
            "status": pa.array(["ok"] * n),
            "source": pa.array(["bench"] * n),
            "queue_ms": queue,
            "lock_wait_ms": zeros,
            "preprocess_ms": pre,
            "h2d_ms": h2d,
            "compute_ms": compute,
            "d2h_ms": d2h,
            "postprocess_ms": post,
            "other_ms": zeros,
            "lock_name": pa.nulls(n, pa.string()),
            "lock_holder": pa.nulls(n, pa.string()),
            "ttft_ms": pa.nulls(n, pa.float64()),
            "replica": pa.nulls(n, pa.string()),
        }
        assert set(PHASE_COLUMNS) <= set(cols)
        parts.append(pa.table([pa.array(cols[f.name], type=f.type) for f in schema], schema=schema))
    return pa.concat_tables(parts)


def _samples(rng: np.random.Generator, start_ns: int) -> tuple[pa.Table, pa.Table]:
    ts = start_ns + np.arange(3600, dtype=np.int64) * 1_000_000_000
    sec = np.arange(3600)
    spike = (sec >= SPIKE[0]) & (sec < SPIKE[1])
    gpu_rows, proc_rows = [], []
    for gpu in ("gpu0", "gpu1"):
        sm = np.clip(rng.normal(55, 5, 3600) + 35 * spike * (gpu == "gpu0"), 0, 100)
        n = 3600
        gpu_rows.append(
            {
                "ts_ns": ts,
                "host": ["bench"] * n,
                "gpu": [gpu] * n,
                "sm_util": sm,
                "mem_util": np.clip(sm * 0.6, 0, 100),
                "dram_active": sm / 150,
                "pcie_tx_bps": rng.normal(2e9, 2e8, n),
                "pcie_rx_bps": rng.normal(3e9, 2e8, n),
                "nvlink_tx_bps": np.zeros(n),
                "nvlink_rx_bps": np.zeros(n),
                "mem_used_bytes": np.full(n, 60 * 2**30, dtype=np.int64),
                "mem_total_bytes": np.full(n, 80 * 2**30, dtype=np.int64),
                "power_w": 300 + 3 * sm,
                "temp_c": np.full(n, 60.0),
                "sm_clock_mhz": np.full(n, 1980.0),
                "max_sm_clock_mhz": np.full(n, 1980.0),
                "clock_event_reasons": np.zeros(n, dtype=np.int64),
            }
        )
    procs = [(m, g, 1000 + i) for i, (m, g) in enumerate(MODELS)] + [("etl-job", "gpu1", 2000)]
    for name, gpu, pid in procs:
        n = 3600
        sm = np.clip(rng.normal(20, 3, n) + 30 * spike * (name == "embed"), 0, 100)
        proc_rows.append(
            {
                "ts_ns": ts,
                "host": ["bench"] * n,
                "gpu": [gpu] * n,
                "pid": np.full(n, pid),
                "process_name": [name] * n,
                "model": [name if pid < 2000 else None] * n,
                "sm_util": sm,
                "mem_util": sm / 2,
                "mem_used_bytes": np.full(n, 10 * 2**30, dtype=np.int64),
                "cpu_cores": np.full(n, 0.5),
            }
        )
    out = []
    for table, rows in (("gpu_samples", gpu_rows), ("process_samples", proc_rows)):
        schema = arrow_schema(table)
        parts = [
            pa.table([pa.array(r[f.name], type=f.type) for f in schema], schema=schema)
            for r in rows
        ]
        out.append(pa.concat_tables(parts))
    return out[0], out[1]


def build_store(path: Path, start_ns: int, rate: float) -> int:
    """Write the hour into ``path``; returns the number of requests."""
    rng = np.random.default_rng(8)
    reqs = _requests(rng, start_ns, rate)
    g, p = _samples(rng, start_ns)
    with Store(path) as store:
        with store.cursor() as cur:
            for name, t in (("requests", reqs), ("gpu_samples", g), ("process_samples", p)):
                cur.register("_t", t)
                cur.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _t")
                cur.unregister("_t")
        Maintenance(store).refresh_rollups()
        book = IncidentBook(store)
        end = start_ns + HOUR_NS
        src = StoreSource(store)
        for model, gpu in MODELS:
            diags = [
                d
                for d in diagnose(src, model, TimeRange(start_ns, end), slo_ms=SLO_MS[model])
                if d.gpu == gpu
            ]
            book.update(diags, model, gpu, start_ns, end)
    return reqs.num_rows


def _payloads(api: str, params: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """One request body per page callback, as the renderer builds it, with the page's
    params store and no tick (a first render)."""
    deps = httpx.get(f"{api}/_dash-dependencies", timeout=30).json()
    out = []
    for d in deps:
        ids = [i["id"] for i in d["inputs"]]
        if not all(isinstance(i, str) for i in ids) or any(i.startswith("_pages") for i in ids):
            continue  # Dash's own router and the pattern-matching buttons
        page = next((i for i in ids if i.endswith("-params")), None)
        if page is None:
            continue
        inputs = [{**i, "value": params[page] if i["id"] == page else None} for i in d["inputs"]]
        state = [{**s, "value": None} for s in d["state"]]
        outputs = [_output(o) for o in d["output"].strip(".").split("...")]
        body = {
            "output": d["output"],
            "outputs": outputs if d["output"].startswith("..") else outputs[0],
            "inputs": inputs,
            "changedPropIds": [f"{page}.data"],
            "state": state,
        }
        out.append((d["output"].strip(".").split("...")[0], body))
    return out


def _output(spec: str) -> dict[str, str]:
    cid, prop = spec.rsplit(".", 1)
    return {"id": cid, "property": prop}


def _time(client: httpx.Client, body: dict[str, Any], repeats: int) -> tuple[list[float], Any]:
    times = []
    resp: Any = None
    for _ in range(repeats):
        t = time.perf_counter()
        r = client.post("/_dash-update-component", json=body)
        times.append(time.perf_counter() - t)
        if r.status_code not in (200, 204):
            raise SystemExit(f"callback {body['output']} answered {r.status_code}: {r.text[:500]}")
        resp = r.json() if r.status_code == 200 else None
    return times, resp


def _p95(xs: list[float]) -> float:
    return float(np.percentile(xs, 95))


_PARTS_JS = """
const nav = performance.getEntriesByType('navigation')[0];
const res = performance.getEntriesByType('resource');
const cbs = res.filter(r => r.name.includes('_dash-update-component'));
const js = res.filter(r => r.name.endsWith('.js'));
const plotly = js.filter(r => r.name.includes('plotly'));
return {
  'HTML+JS loaded': nav.domContentLoadedEventEnd / 1000,
  'scripts fetched': Math.max(...js.map(r => r.responseEnd)) / 1000,
  'plotly.js fetched': Math.max(...plotly.map(r => r.responseEnd)) / 1000,
  'JS bytes': js.reduce((a, r) => a + r.encodedBodySize, 0) / 1e6,  // as sent (gzip)
  'callbacks': cbs.length,
  'slowest callback': Math.max(...cbs.map(r => r.duration)) / 1000,
  'last callback answered': Math.max(...cbs.map(r => r.responseEnd)) / 1000,
};
"""


def _chromium() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as ChromeService

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        opts.add_argument(arg)
    return webdriver.Chrome(service=ChromeService("/usr/bin/chromedriver"), options=opts)


def _first_render(driver: Any, url: str) -> tuple[float, dict[str, float]]:
    """Navigation start until the chart, the tiles and the incident list are drawn and no
    callback is in flight (seconds), with the parts from the Resource Timing entries."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get("about:blank")
    driver.get(url + "/?range=1h")

    def done(d: Any) -> bool:
        return bool(
            d.find_elements(By.CSS_SELECTOR, "#ov-p99 .js-plotly-plot .scatterlayer path")
            and d.find_elements(By.CSS_SELECTOR, "#ov-incident-table, #ov-incidents .empty-state")
            and d.find_elements(By.CSS_SELECTOR, "#ov-gpus .tile")
            and not d.find_elements(By.CSS_SELECTOR, "[data-dash-is-loading='true']")
        )

    WebDriverWait(driver, 30, poll_frequency=0.02).until(done)
    total = driver.execute_script("return performance.now()") / 1000
    return total, driver.execute_script(_PARTS_JS)


def _browser_rounds(
    cfg: Any, end_ns: int, variants: dict[str, dict[str, Any]], rounds: int
) -> dict[str, list[tuple[float, float, dict[str, float]]]]:
    """Per variant (``create_app`` keyword arguments), ``rounds`` times, taking turns: the
    real Service with that dashboard, a fresh Chromium (empty cache: a first visit), one cold
    and one warm load. Returns (cold s, warm s, cold parts) per round."""
    import cotenant.dashboard.app

    plain = cotenant.dashboard.app.create_app
    out: dict[str, list[tuple[float, float, dict[str, float]]]] = {v: [] for v in variants}
    try:
        for _ in range(rounds):
            for name, kw in variants.items():
                # Service._mount_dashboard imports create_app when it builds the app
                cotenant.dashboard.app.create_app = functools.partial(plain, **kw)
                svc = Service(cfg, clock_ns=lambda: end_ns)
                th = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
                th.start()
                svc.started.wait(60)
                assert svc.endpoints is not None
                driver = _chromium()
                try:
                    cold, parts = _first_render(driver, svc.endpoints.api)
                    warm, _ = _first_render(driver, svc.endpoints.api)
                finally:
                    driver.quit()
                    svc.stop()
                    th.join(60)
                out[name].append((cold, warm, parts))
    finally:
        cotenant.dashboard.app.create_app = plain
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument(
        "--browser-loads",
        type=int,
        default=5,
        help="rounds of (fresh Chromium: cold load, warm load) per dashboard variant",
    )
    ap.add_argument(
        "--plotly-js",
        type=Path,
        help="also measure the dashboard serving this plotly.js bundle (e.g. a partial bundle)",
    )
    ap.add_argument("--rate", type=float, default=200.0, help="requests/s per model")
    ap.add_argument("--keep", type=Path, help="build (or reuse) the store in DIR")
    args = ap.parse_args()
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="cotenant-dash-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "bench.duckdb"
    # the hour ends at the last whole minute: older data would be expired by the service's
    # retention (raw rows: 24 h) as soon as it starts
    start_ns = (time.time_ns() // 60_000_000_000) * 60_000_000_000 - HOUR_NS
    if path.exists():
        with Store(path, read_only=True) as old, old.cursor() as cur:
            row = cur.execute("SELECT min(ts_start_ns) FROM requests").fetchone()
        if row and row[0] is not None and row[0] >= start_ns - 12 * HOUR_NS:
            start_ns = int(row[0]) - int(row[0]) % 60_000_000_000
        else:
            path.unlink()
    if not path.exists():
        t = time.perf_counter()
        n = build_store(path, start_ns, args.rate)
        print(
            f"built {n:,} requests (+ rollups, incidents) in {time.perf_counter() - t:.0f} s",
            file=sys.stderr,
        )
    end_ns = start_ns + HOUR_NS
    env = {
        "COTENANT_STORE_PATH": str(path),
        "COTENANT_SERVER_PORT": "0",
        "COTENANT_OTLP_HTTP_ENABLED": "false",
        "COTENANT_OTLP_GRPC_ENABLED": "false",
        "COTENANT_NVML_ENABLED": "false",
        "COTENANT_ANALYSIS_ENABLED": "false",
        "COTENANT_ANALYSIS_SLO_MS": ",".join(f"{k}={v}" for k, v in SLO_MS.items()),
    }
    cfg = load_config(None, env=env)
    svc = Service(cfg, clock_ns=lambda: end_ns)
    th = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
    th.start()
    svc.started.wait(60)
    assert svc.endpoints is not None
    api = svc.endpoints.api
    try:
        inc = svc.analyzer.incidents(model="tts")
        iid = inc[0]["id"] if inc else None
        params = {
            "ov-params": {"range": "1h"},
            "inc-params": {"id": iid, "range": None},
            "gpu-params": {"range": "1h"},
            "act-params": {"range": "1h"},
            "rep-params": {"week": None, "range": None},
        }
        rows = []
        drawn = None
        with httpx.Client(base_url=api, timeout=60) as c:
            for name, body in _payloads(api, params):
                ts, resp = _time(c, body, args.repeats)
                rows.append((name, statistics.median(ts), _p95(ts), max(ts)))
                if name == "ov-p99.figure" and resp:
                    drawn = resp["response"]["ov-drawn"]["data"]
            if drawn:
                tick = next(b for n, b in _payloads(api, params) if n == "ov-p99.figure")
                tick["changedPropIds"] = ["shell-tick.n_intervals"]
                tick["inputs"][1]["value"] = 1
                tick["state"][0]["value"] = {**drawn, "next_ns": drawn["next_ns"] - 120_000_000_000}
                ts, _ = _time(c, tick, args.repeats)
                rows.append(
                    ("ov-p99 live refresh (Patch)", statistics.median(ts), _p95(ts), max(ts))
                )
    finally:
        svc.stop()
        th.join(60)
    from cotenant.dashboard import plotlyjs

    variants: dict[str, dict[str, Any]] = {
        "before (every script with the page)": {"eager_loading": True},
        f"after ({plotlyjs.choose().path.name})": {},
    }
    if args.plotly_js:
        variants[f"after ({args.plotly_js.name})"] = {"plotly_js": args.plotly_js}
    loads = _browser_rounds(cfg, end_ns, variants, args.browser_loads) if args.browser_loads else {}
    print(
        f"cotenant dashboard bench: 1 h, {len(MODELS)} models x {args.rate:g} rps, "
        f"nproc={os.cpu_count()}"
    )
    print(f"{'callback (first output)':40s} {'median ms':>10s} {'p95 ms':>8s} {'max ms':>8s}")
    for name, med, p95, mx in rows:
        print(f"{name:40s} {med * 1e3:10.0f} {p95 * 1e3:8.0f} {mx * 1e3:8.0f}")
    worst = max(r[2] for r in rows)
    print(f"worst callback p95: {worst * 1e3:.0f} ms (goal <= 300 ms)")
    if loads:
        print(
            f"Overview first full render (Chromium, goal <= 1.5 s), {args.browser_loads} rounds "
            "taking turns, each a fresh browser: cold = first visit (empty cache), warm = reload"
        )
    for name, runs in loads.items():
        cold = statistics.median(r[0] for r in runs)
        warm = statistics.median(r[1] for r in runs)
        print(f"  {name:44s} cold median {cold:.2f} s, warm median {warm:.2f} s")
        print("    cold loads: " + ", ".join(f"{r[0]:.2f}" for r in runs) + " s")
        parts = runs[[r[0] for r in runs].index(sorted(r[0] for r in runs)[len(runs) // 2])][2]
        print(
            "    median cold load: "
            + ", ".join(
                f"{v:.0f} callbacks"
                if k == "callbacks"
                else f"{v:.1f} MB of JS sent"
                if k == "JS bytes"
                else f"{k} {v:.2f} s"
                for k, v in parts.items()
            )
        )
    if len(loads) > 1:
        base = statistics.median(r[0] for r in next(iter(loads.values())))
        for name, runs in list(loads.items())[1:]:
            ratio = base / statistics.median(r[0] for r in runs)
            print(f"  cold: {name} is {ratio:.2f}x faster than before")
    return 0


if __name__ == "__main__":
    sys.exit(main())

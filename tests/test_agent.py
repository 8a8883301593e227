"""``cotenant agent``: its /metrics (fleet histograms with exemplars, lock waits, DCGM-named GPU
counters, host CPU per process) and its drill-down API, on a real agent fed real OTLP spans."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families
from spans import MS, SpanFactory

from cotenant.app.config import load_config
from cotenant.app.service import Service
from cotenant.collectors.fleet_histogram import TOTAL_BUCKETS_S, FleetHistogram
from cotenant.collectors.nvml.fake import FakeNvml
from cotenant.core.phases import PHASE_COLUMNS
from cotenant.store.schema import arrow_schema

GIB = 1 << 30


def _requests(lat_ms: np.ndarray, model: str = "tts", gpu: str = "GPU-a") -> pa.Table:
    n = len(lat_ms)
    schema = arrow_schema("requests")
    cols: dict[str, object] = {
        "ts_start_ns": np.arange(n, dtype=np.int64) * 1000,
        "ts_end_ns": np.arange(n, dtype=np.int64) * 1000 + 500,
        "latency_ms": lat_ms,
        "trace_id": [f"{i:032x}" for i in range(n)],
        "span_id": [f"{i:016x}" for i in range(n)],
        "model": [model] * n,
        "gpu": [gpu] * n,
        "status": ["ok"] * n,
        "source": ["ours"] * n,
    }
    for c in PHASE_COLUMNS:
        cols[c] = np.zeros(n)
    cols["compute_ms"] = lat_ms * 0.8
    cols["queue_ms"] = lat_ms * 0.2
    arrays = [
        pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _quantile(q: float, les: list[float], cum: list[float]) -> float:
    """Prometheus' histogram_quantile: linear inside the bucket."""
    rank = q * cum[-1]
    i = int(np.searchsorted(cum, rank, side="left"))
    lo = 0.0 if i == 0 else les[i - 1]
    below = 0.0 if i == 0 else cum[i - 1]
    return lo + (les[i] - lo) * (rank - below) / (cum[i] - below)


@pytest.mark.parametrize("median_ms,sigma", [(12.0, 0.4), (180.0, 0.8), (2500.0, 0.3)])
def test_total_buckets_give_the_p99_within_ten_percent(median_ms: float, sigma: float) -> None:
    rng = np.random.default_rng(7)
    lat = median_ms * np.exp(sigma * rng.standard_normal(20_000))
    h = FleetHistogram("node-a")
    h.observe_requests(_requests(lat))
    fam = next(f for f in text_string_to_metric_families(h.render()))
    buckets = [
        (float(s.labels["le"]), s.value)
        for s in fam.samples
        if s.name.endswith("_bucket") and s.labels["phase"] == "total"
    ]
    les = [b for b, _ in buckets[:-1]]
    cum = [c for _, c in buckets[:-1]]
    got = _quantile(0.99, les, cum) * 1e3
    exact = float(np.quantile(lat, 0.99))
    assert abs(got - exact) / exact < 0.10, (got, exact)
    # the classic default layout (1-2.5-5) is much coarser there
    assert len(TOTAL_BUCKETS_S) == 49 and TOTAL_BUCKETS_S[0] == 0.001


def test_series_carry_node_exemplars_lock_waits_and_only_phases_seen() -> None:
    h = FleetHistogram("node-a")
    t = _requests(np.array([10.0, 11.0, 900.0]))
    lock = np.array([0.0, 0.0, 500.0])
    t = t.set_column(t.schema.get_field_index("lock_wait_ms"), "lock_wait_ms", pa.array(lock))
    t = t.set_column(
        t.schema.get_field_index("lock_name"), "lock_name", pa.array([None, None, "tokenizer"])
    )
    t = t.set_column(
        t.schema.get_field_index("lock_holder"), "lock_holder", pa.array([None, None, "chat"])
    )
    t = t.set_column(t.schema.get_field_index("status"), "status", pa.array(["ok", "ok", "error"]))
    h.observe_requests(t)
    reg = CollectorRegistry()
    reg.register(h)
    om = h.render(openmetrics=True) + "# EOF\n"
    # valid OpenMetrics (the strict parser), the slow request the exemplar of its bucket
    ex = [
        s
        for f in om_families(om)
        for s in f.samples
        if s.exemplar is not None and s.exemplar.labels["trace_id"] == f"{2:032x}"
    ]
    assert len(ex) == 1 and ex[0].labels["phase"] == "total" and ex[0].labels["node"] == "node-a"
    assert ex[0].exemplar is not None and ex[0].exemplar.value == 0.9
    assert "trace_id" not in h.render()  # the classic text format has no exemplars
    text = h.render() + generate_latest(reg).decode()
    phases = {
        s.labels["phase"]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if "phase" in s.labels
    }
    assert phases == {"total", "compute", "queue", "lock_wait"}  # no empty phase series
    waits = {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.labels.get("lock") == "tokenizer" and s.labels.get("holder") == "chat"
    }
    assert waits == {"cotenant_lock_waits_total": 1.0, "cotenant_lock_wait_seconds_total": 0.5}
    assert "cotenant_request_errors_total{" in text and 'model="tts",node="node-a"} 1.0' in text
    assert h.series == (49 + 1 + 2) + 3 * (8 + 1 + 2) + 1 + 2  # histogram, errors, locks


def _agent(
    tmp: Path, fake: FakeNvml, env: dict[str, str] | None = None
) -> tuple[Service, threading.Thread, str, str]:
    cfg = load_config(
        env={
            "COTENANT_SERVER_PORT": "0",
            "COTENANT_OTLP_HTTP_PORT": "0",
            "COTENANT_OTLP_GRPC_ENABLED": "false",
            "COTENANT_STORE_PATH": str(tmp / "agent.duckdb"),
            "COTENANT_STORE_FLUSH_INTERVAL_S": "0.05",
            "COTENANT_NVML_POLL_INTERVAL_S": "0.05",
            "COTENANT_NVML_HOST": "node-a",
            "COTENANT_AGENT_NODE": "node-a",
            "COTENANT_PROCFS_INTERVAL_S": "0.1",
            **(env or {}),
        }
    )
    svc = Service(cfg, nvml=fake, role="agent")
    t = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
    t.start()
    assert svc.started.wait(30) and svc.endpoints is not None
    assert svc.endpoints.otlp_http is not None
    return svc, t, svc.endpoints.api, svc.endpoints.otlp_http


def _poll(url: str, want: str, headers: dict[str, str] | None = None) -> str:
    deadline = time.monotonic() + 30
    while True:
        text = httpx.get(url, headers=headers or {}, timeout=5).text
        if want in text or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def test_a_running_agent_exposes_what_central_diagnosis_reads_and_drills_down(
    tmp_path: Path,
) -> None:
    fake = FakeNvml()
    gpu = fake.model.add_gpu()
    fake.model.set_gpu(gpu, sm_util=61, memory_used_bytes=10 * GIB, power_w=300, sm_clock_mhz=1500)
    fake.model.add_process(gpu, 4242, "python3", 5 * GIB)
    fake.model.record_process_util(4242, 40, 10)
    svc, thread, api, otlp = _agent(tmp_path, fake)
    try:
        f = SpanFactory({"service.name": "tts", "host.name": "node-a"})
        now = time.time_ns()
        ids = {}
        for i, lat in enumerate((20.0, 250.0, 30.0, 80.0)):
            ids[lat] = f.ours(
                "tts",
                now - (10 - i) * 1000 * MS,
                lat,
                [("queue", 0, lat / 4), ("compute", lat / 4, lat)],
                attrs={"cotenant.gpu": gpu},
            )
        exporter = OTLPSpanExporter(endpoint=otlp, timeout=10)
        assert exporter.export(f.take()).name == "SUCCESS"
        exporter.shutdown()
        metrics = f"{api}/metrics"
        om = {"Accept": "application/openmetrics-text; version=1.0.0"}
        text = _poll(metrics, "DCGM_FI_DEV_GPU_UTIL", om)
        assert text.rstrip().endswith("# EOF")  # OpenMetrics when asked for
        assert len(list(om_families(text))) > 20  # and valid (the strict parser)
        assert f'trace_id="{ids[250.0][0]}"' in text  # the slow request is an exemplar
        # labelled as dcgm-exporter 4.8 labels it: the host under `hostname`
        dcgm = f'DCGM_FI_DEV_GPU_UTIL{{UUID="{gpu}",device="nvidia0",gpu="0",hostname="node-a"'
        assert dcgm in text
        plain = httpx.get(metrics, timeout=5).text
        assert "# EOF" not in plain and "trace_id" not in plain
        got = {
            (s.name, s.labels.get("phase")): s.value
            for fam in text_string_to_metric_families(plain)
            for s in fam.samples
            if s.labels.get("node") == "node-a" and s.labels.get("gpu") == gpu
        }
        assert got[("cotenant_request_duration_seconds_count", "total")] == 4
        assert got[("cotenant_request_duration_seconds_sum", "total")] == pytest.approx(0.38)
        assert 'cotenant_gpu_process_sm_utilization_ratio{gpu="' in plain
        _poll(metrics, "cotenant_process_cpu_cores{")  # host CPU per process from procfs

        def slowest(**params: object) -> httpx.Response:
            return httpx.get(f"{api}/api/v1/slowest", params=params, timeout=5)

        r = slowest(model="tts", since="5m", until="now", limit=2)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["node"] == "node-a" and body["count"] == 2
        assert [x["latency_ms"] for x in body["requests"]] == pytest.approx([250.0, 80.0])
        assert body["requests"][0]["trace_id"] == ids[250.0][0]
        for params, field in (
            ({"since": "5m", "until": "now"}, "model"),
            ({"model": "tts", "until": "now"}, "since"),
            ({"model": "tts", "since": "yesterday-ish", "until": "now"}, "since"),
            ({"model": "tts", "since": "now", "until": "5m"}, "until"),
            ({"model": "tts", "since": "30d", "until": "now"}, "drill_max_range_h"),
            ({"model": "tts", "since": "5m", "until": "now", "limit": 5000}, "limit"),
            ({"model": "tts", "since": "5m", "until": "now", "limit": "x"}, "limit"),
        ):
            r = slowest(**params)
            assert r.status_code == 400, (params, r.text)
            assert field in r.json()["error"], (params, r.json())
        # an agent has no analysis, dashboard or actuators
        assert httpx.get(f"{api}/api/v1/incidents", timeout=5).status_code == 404
        assert httpx.get(f"{api}/", timeout=5).status_code == 404
    finally:
        svc.stop()
        thread.join(60)


def test_a_spooled_agent_drills_down_into_every_acknowledged_request(tmp_path: Path) -> None:
    # [agent] spool: acknowledged once in the spool; an hour-long flush interval, so only the
    # drill-down's flush can bring the rows into the store before it reads
    fake = FakeNvml()
    gpu = fake.model.add_gpu()
    env = {"COTENANT_STORE_SPOOL": "true", "COTENANT_STORE_FLUSH_INTERVAL_S": "3600"}
    svc, thread, api, otlp = _agent(tmp_path, fake, env)
    try:
        f = SpanFactory({"service.name": "tts", "host.name": "node-a"})
        now = time.time_ns()
        ids = [
            f.ours(
                "tts",
                now - (10 - i) * 100 * MS,
                10.0 + i,
                [("queue", 0, 1), ("compute", 1, 5)],
                attrs={"cotenant.gpu": gpu, "cotenant.tenant": "t1"},
            )[0]
            for i in range(5)
        ]
        exporter = OTLPSpanExporter(endpoint=otlp, timeout=10)
        assert exporter.export(f.take()).name == "SUCCESS"
        exporter.shutdown()
        assert list((tmp_path / "agent.duckdb.spool").glob("*.log"))  # acknowledged from it
        r = httpx.get(
            f"{api}/api/v1/slowest",
            params={"model": "tts", "since": "5m", "until": "now", "limit": 10},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        rows = r.json()["requests"]
        assert sorted(x["trace_id"] for x in rows) == sorted(ids)
        assert set(arrow_schema("requests").names) <= set(rows[0])  # every column
        assert rows[0]["tenant"] == "t1" and rows[0]["compute_ms"] == pytest.approx(4.0)
    finally:
        svc.stop()
        thread.join(60)


@pytest.mark.parametrize(
    "template", ["http://{host}:8050", "{node}:8050", "http://{node", "ftp://{instance}"]
)
def test_a_bad_agent_url_template_is_refused_naming_the_key(template: str) -> None:
    from cotenant.app.fleet_drill import check_template
    from cotenant.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"prometheus\.agent_url_template"):
        check_template(template)
    assert check_template("https://{node}.agents:8050/x") == "https://{node}.agents:8050/x"

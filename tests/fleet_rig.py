"""The fleet of the fleet tests: three ``cotenant agent`` processes on loopback, each fed one
node's part of a three-node scenario by ``cotenant simulate --otlp`` (spans) and ``--nvml-feed``
(the simulated GPU, which the agent's real NVML collector polls through ``--fake-nvml``), a
PromQL engine scraping them every second, and a central ``cotenant serve`` reading that engine
(:func:`running_fleet`), with helpers to read what central serve shows."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import yaml
from promserver import free_port

from cotenant.analysis.analyzer import Analyzer
from cotenant.analysis.detector.detect import DetectorParams
from cotenant.analysis.incidents import IncidentBook
from cotenant.core.slos import Slos
from cotenant.simulator import output
from cotenant.simulator.scenario_load import load_scenario
from cotenant.store.bulk_load import append_tables
from cotenant.store.db import Store
from cotenant.store.source import StoreSource

ROOT = Path(__file__).resolve().parents[1]
BURST = (30, 48)  # seconds of node A's scenario when sdxl's burst runs
WARMUP = 15  # windows with requests the detector learns from before the burst (of ~30)
GPU_A = "GPU-gpu-a0"  # node A's GPU as NVML names it (and the spans, streamed with its feed)

TTS = {
    "name": "tts",
    "slo_p99_ms": 100,
    "arrival": {"kind": "poisson", "rate_rps": 50},
    "batching": {"max_batch": 2, "max_wait_ms": 2},
    "preprocess_ms": 2,
    "kernel": {
        "base_ms": 4,
        "per_item_ms": 4.5,
        "sm_demand": 0.4,
        "dram_demand": 0.4,
        "memory_bound": 0.5,
    },
    "transfer": {"h2d_mb": 0.05, "d2h_mb": 1.0},
    "memory_gib": 8,
}
SDXL = {
    "name": "sdxl",
    "priority": 1,
    "arrival": {"kind": "poisson", "rate_rps": 0.03},
    "batching": {"max_batch": 2, "max_wait_ms": 20},
    "kernel": {
        "base_ms": 700,
        "per_item_ms": 250,
        "sm_demand": 0.95,
        "dram_demand": 0.7,
        "memory_bound": 0.4,
    },
    "transfer": {"h2d_mb": 0.1, "d2h_mb": 3.0},
    "memory_gib": 24,
}


def node_scenarios(tmp: Path) -> dict[str, Path]:
    """One cluster, three nodes: on node A an image model's burst slows a speech model on a
    time-sliced GPU; nodes B and C serve quietly (their models must raise nothing)."""
    out = {}
    for node, models, faults in (
        ("a", [TTS, SDXL], [{"kind": "cotenant_burst", "target": "sdxl", "start_s": BURST[0],
                             "duration_s": BURST[1] - BURST[0], "factor": 35}]),
        ("b", [{**TTS, "name": "chat"}, {**TTS, "name": "embed", "slo_p99_ms": 80}], []),
        ("c", [{**TTS, "name": "ocr", "arrival": {"kind": "poisson", "rate_rps": 30}}], []),
    ):  # fmt: skip
        gpu = f"gpu-{node}0"
        doc = {
            "version": 1,
            "name": f"fleet-node-{node}",
            "seed": 11,
            "duration_s": 60,
            "host": f"node-{node}",
            "gpus": [{"id": gpu, "type": "h100-sxm", "sharing": "timeslice"}],
            "models": [{**m, "gpu": gpu} for m in models],
            "faults": faults,
        }
        p = tmp / f"node-{node}.yaml"
        p.write_text(yaml.safe_dump(doc, sort_keys=False))
        out[node] = p
    return out


@dataclass
class Proc:
    """A ``cotenant`` subprocess; ``api`` and ``otlp`` from its ``listening`` line."""

    proc: subprocess.Popen[str]
    api: str
    otlp: str
    log: Path
    errf: IO[str]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.errf.close()


Spawned = tuple[subprocess.Popen[str], IO[str]]


def spawn(cmd: list[str], tmp: Path, name: str, env: dict[str, str]) -> Spawned:
    """Start ``cotenant CMD`` (stderr to ``name``.log); returns the process and its log file."""
    errf = (tmp / f"{name}.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cotenant", *cmd],
        stdout=subprocess.PIPE,
        stderr=errf,
        text=True,
        cwd=ROOT,
        env={
            **os.environ,
            "COTENANT_SERVER_PORT": "0",
            "COTENANT_OTLP_HTTP_PORT": "0",
            "COTENANT_OTLP_GRPC_ENABLED": "false",
            "COTENANT_NVML_ENABLED": "false",
            "COTENANT_PROCFS_ENABLED": "false",  # one machine plays three nodes
            **env,
        },
    )
    return proc, errf


def started(spawned: Spawned, tmp: Path, name: str) -> Proc:
    """Wait for a spawned process's ``listening`` line."""
    proc, errf = spawned
    log = tmp / f"{name}.log"
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line or line.startswith("listening "):
            break
    m = re.match(r"listening api=(\S+) otlp_http=(\S+)", line)
    if not m:
        proc.kill()
        proc.wait(30)
        raise RuntimeError(f"cotenant {name} did not start: {log.read_text()}")
    return Proc(proc, m.group(1), m.group(2), log, errf)


def embedded_top_cause(scenario: Path) -> tuple[str, str]:
    """The top cause embedded mode names for tts on the same scenario (store: spans, GPU and
    per-process counters)."""
    s = load_scenario(scenario)
    t0 = 1_800_000_000 * 10**9
    r = output.run(s, start_ns=t0)
    store = Store(":memory:")
    try:
        tables = {"requests": r.requests, "gpu_samples": r.gpu_samples}
        append_tables(store, {**tables, "process_samples": r.process_samples})
        a = Analyzer(
            StoreSource(store),
            IncidentBook(store),
            slos=Slos.of_maps({"tts": 100.0}),
            step_s=1.0,
            params=DetectorParams(min_samples=WARMUP),
        )
        got = a.diagnose("tts", t0, t0 + int(s.duration_s * 1e9))
    finally:
        store.close()
    top = got["diagnoses"][0]["causes"][0]
    return top["kind"], top["culprit"]


INCIDENT_PAGE = (
    "inc-summary.children...inc-latency-box.children...inc-tokens-box.children"
    "...inc-phases-box.children...inc-causes-box.children...inc-evidence-box.children"
    "...inc-actions.children...inc-drill.children"
)


def dash_response(api: str, output: str, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """A page callback's content as the browser gets it (Dash's JSON: output id -> props)."""
    outs = [dict(zip(("id", "property"), o.rsplit(".", 1), strict=True)) for o in
            output.split("...")]  # fmt: skip
    body = {
        "output": f"..{output}..",
        "outputs": outs,
        "inputs": inputs,
        "changedPropIds": [f"{inputs[0]['id']}.{inputs[0]['property']}"],
        "state": [],
    }
    r = httpx.post(f"{api}/_dash-update-component", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json()["response"])


def dash_callback(api: str, output: str, inputs: list[dict[str, Any]]) -> str:
    """A page callback's content, as text to search."""
    return str(dash_response(api, output, inputs))


def table_rows(tree: Any, table_id: str) -> list[list[str]]:
    """The body rows (cell texts) of the table with id ``table_id`` in a Dash response."""

    def text(node: Any) -> str:
        if isinstance(node, dict):
            return text(node.get("props", {}).get("children"))
        if isinstance(node, list):
            return "".join(text(x) for x in node)
        return "" if node is None else str(node)

    def find(node: Any) -> Any:
        if isinstance(node, dict):
            if node.get("props", {}).get("id") == table_id:
                return node
            node = list(node.values())
        if isinstance(node, list):
            return next((t for t in map(find, node) if t is not None), None)
        return None

    table = find(tree)
    if table is None:
        return []
    body = table["props"]["children"][1]["props"]["children"]
    return [[text(td) for td in tr["props"]["children"]] for tr in body]


def incident_page(api: str, incident_id: str) -> str:
    inputs = [{"id": "inc-params", "property": "data", "value": {"id": incident_id}}]
    return dash_callback(api, INCIDENT_PAGE, inputs)


def top_cause(inc: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, culprit) of an incident's first cause that is not ``unknown``."""
    c = next((c for c in inc.get("causes", []) if c["kind"] != "unknown"), None)
    return None if c is None else (c["kind"], c["culprit"])


Engine = Callable[[Path, list[str]], contextlib.AbstractContextManager[Any]]
"""(folder, scrape targets) -> a running PromQL engine with ``url`` (and ``proc``)."""


@contextlib.contextmanager
def running_fleet(tmp_path: Path, engine: Engine) -> Iterator[dict[str, Any]]:
    """The fleet, streams started; yields ``tmp, prom (the engine), agents, central,
    scenarios, feeds`` (each node's NVML feed file); stops everything on exit."""
    scenarios = node_scenarios(tmp_path)
    ports = {n: free_port() for n in scenarios}
    feeds = {n: tmp_path / f"nvml-{n}.jsonl" for n in scenarios}
    spawned = {
        n: spawn(
            ["agent", "--store", str(tmp_path / f"agent-{n}.duckdb"), "--fake-nvml", str(feeds[n])],
            tmp_path,
            f"agent-{n}",
            {
                "COTENANT_AGENT_NODE": f"node-{n}",
                "COTENANT_SERVER_PORT": str(ports[n]),
                "COTENANT_STORE_FLUSH_INTERVAL_S": "0.1",
            },
        )
        for n in scenarios
    }
    targets = [f"127.0.0.1:{p}" for p in ports.values()]
    procs: list[Proc] = []
    streams: list[subprocess.Popen[bytes]] = []
    try:
        with engine(tmp_path / "prom", targets) as prom:
            agents = {n: started(p, tmp_path, f"agent-{n}") for n, p in spawned.items()}
            procs += agents.values()
            streams += [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "cotenant",
                        "simulate",
                        str(p),
                        "--otlp",
                        agents[n].otlp,
                        "--nvml-feed",
                        str(feeds[n]),
                        "--no-truth",
                    ],
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for n, p in scenarios.items()
            ]
            central_proc = spawn(
                ["serve", "--store", str(tmp_path / "central.duckdb")],
                tmp_path,
                "central",
                {
                    "COTENANT_PROMETHEUS_URL": prom.url,
                    "COTENANT_PROMETHEUS_SCRAPE_INTERVAL_S": "1",
                    "COTENANT_PROMETHEUS_TIMEOUT_S": "3",
                    "COTENANT_ANALYSIS_INTERVAL_S": "1",
                    "COTENANT_ANALYSIS_HORIZON_S": "120",
                    "COTENANT_ANALYSIS_REREAD_S": "6",
                    "COTENANT_ANALYSIS_SLO_MS": "tts=100,chat=100,embed=80,ocr=100",
                    # 30 s of baseline before the burst (WARMUP below)
                    "COTENANT_ANALYSIS_WARMUP_WINDOWS": str(WARMUP),
                    "COTENANT_ACTUATORS_MODE": "off",
                },
            )
            central = started(central_proc, tmp_path, "central")
            procs.append(central)
            yield {
                "tmp": tmp_path,
                "prom": prom,
                "agents": agents,
                "central": central,
                "scenarios": scenarios,
                "feeds": feeds,
            }
    finally:
        for s in streams:
            if s.poll() is None:
                s.kill()
            s.wait(30)
        for p in procs:
            p.stop()
        for p, errf in spawned.values():
            if p.poll() is None:
                p.kill()
                p.wait(30)
            if p.stdout is not None:
                p.stdout.close()
            errf.close()

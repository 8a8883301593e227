"""Replicas in the simulator: the scenario schema, routing, weight changes, the records."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.otlp.normalize import Normalizer
from cotenant.core.errors import ScenarioError, UsageError
from cotenant.simulator.engine import Simulation
from cotenant.simulator.output import requests_table
from cotenant.simulator.scenario_load import parse_scenario
from cotenant.simulator.stream import ScenarioSpanEmitter
from cotenant.store.db import Store
from cotenant.store.schema import SCHEMA_VERSION


def _doc(**chat: Any) -> dict[str, Any]:
    model: dict[str, Any] = {
        "name": "chat",
        "replicas": [
            {"name": "chat-a", "gpu": "gpu0", "weight": 3},
            {"name": "chat-b", "gpu": "gpu1", "weight": 1},
        ],
        "arrival": {"kind": "poisson", "rate_rps": 80},
        "kernel": {"base_ms": 4, "per_item_ms": 0.5},
        "batching": {"max_batch": 4, "max_wait_ms": 1},
        "slo_p99_ms": 50,
    }
    model.update(chat)
    return {
        "name": "replicas",
        "seed": 3,
        "duration_s": 40,
        "gpus": [{"id": "gpu0", "type": "h100-sxm"}, {"id": "gpu1", "type": "h100-sxm"}],
        "models": [
            model,
            {
                "name": "ocr",
                "gpu": "gpu1",
                "arrival": {"kind": "poisson", "rate_rps": 10},
                "kernel": {"base_ms": 3},
            },
        ],
        "processes": [{"name": "train", "gpu": "gpu0", "sm_demand": 0.9}],
    }


def _load(doc: dict[str, Any]) -> Any:
    return parse_scenario(doc, Path("."), source="t.yaml")


def test_replicas_load_with_their_gpus_pids_and_the_model_gpu_is_the_first() -> None:
    s = _load(_doc())
    chat = s.models[0]
    assert chat.gpu == "gpu0" and chat.routing == "weighted"
    assert [(r.name, r.gpu, r.weight) for r in chat.replicas] == [
        ("chat-a", "gpu0", 3),
        ("chat-b", "gpu1", 1),
    ]
    pids = [r.pid for r in chat.replicas] + [s.models[1].replicas and 0] + [s.processes[0].pid]
    assert pids[0] == 1000 and pids[1] >= 3000 and len(set(pids)) == len(pids)
    assert s.models[1].replicas == ()  # an old-style model: no replicas


@pytest.mark.parametrize(
    ("change", "field", "why"),
    [
        ({"gpu": "gpu0"}, "models[0].gpu", "names a gpu per replica"),
        ({"replicas": []}, "models[0].replicas", "non-empty list"),
        (
            {"replicas": [{"name": "a", "gpu": "gpu9"}]},
            "models[0].replicas[0].gpu",
            "no such gpu",
        ),
        (
            {"replicas": [{"name": "a", "gpu": "gpu0", "weight": 300}]},
            "models[0].replicas[0].weight",
            "<= 256",
        ),
        (
            {"replicas": [{"name": "a", "gpu": "gpu0", "weight": 1.5}]},
            "models[0].replicas[0].weight",
            "integer",
        ),
        (
            {"replicas": [{"name": "a", "gpu": "gpu0"}, {"name": "a", "gpu": "gpu1"}]},
            "models[0].replicas[1].name",
            "duplicate",
        ),
        (
            {"replicas": [{"name": "a", "gpu": "gpu0"}, {"name": "b", "gpu": "gpu0"}]},
            "models[0].replicas[1].gpu",
            "duplicate",
        ),
        (
            {"replicas": [{"name": "a", "gpu": "gpu0", "weight": 0}]},
            "models[0].replicas[*].weight",
            "weight > 0",
        ),
        (
            {"replicas": [{"name": "a", "gpu": "gpu0", "color": 1}]},
            "models[0].replicas[0].color",
            "unknown key",
        ),
        ({"routing": "random"}, "models[0].routing", "weighted, least-loaded"),
    ],
)
def test_a_bad_replica_spec_names_the_field(change: dict[str, Any], field: str, why: str) -> None:
    with pytest.raises(ScenarioError) as err:
        _load(_doc(**change))
    assert f"t.yaml: {field}" in str(err.value) and why in str(err.value)


def test_routing_without_replicas_and_a_missing_gpu_are_refused() -> None:
    doc = _doc()
    doc["models"][1]["routing"] = "weighted"
    with pytest.raises(ScenarioError, match=r"models\[1\]\.routing: .*only a model with replicas"):
        _load(doc)
    doc = _doc()
    del doc["models"][1]["gpu"]
    with pytest.raises(ScenarioError, match=r"models\[1\]\.gpu: missing required field"):
        _load(doc)


def test_replica_memory_counts_on_each_of_its_gpus() -> None:
    doc = _doc(memory_gib=50)
    doc["models"][1]["memory_gib"] = 40  # ocr: 40 + chat-b's 50 > 80 GiB on gpu1
    with pytest.raises(ScenarioError, match=r"gpus\[1\]\.type"):
        _load(doc)


def _served(sim: Simulation) -> Counter[tuple[str, Any, str]]:
    c = sim.take_requests()
    return Counter(zip(c["model"], c["replica"], c["gpu"], strict=True))


@pytest.mark.parametrize("routing", ["weighted", "least-loaded"])
def test_each_replica_serves_on_its_gpu_in_proportion_to_its_weight(routing: str) -> None:
    sim = Simulation(_load(_doc(routing=routing)))
    sim.run()
    served = _served(sim)
    a, b = served[("chat", "chat-a", "gpu0")], served[("chat", "chat-b", "gpu1")]
    assert a + b > 2500 and served[("ocr", None, "gpu1")] > 300
    assert set(served) == {
        ("chat", "chat-a", "gpu0"),
        ("chat", "chat-b", "gpu1"),
        ("ocr", None, "gpu1"),
    }
    if routing == "weighted":  # smooth WRR: exactly 3:1 up to the requests still in flight
        assert abs(a / (a + b) - 0.75) < 0.01
    else:  # least-loaded: idle replicas share by weight, loaded ones by queue length
        assert 0.55 < a / (a + b) < 0.9


def test_least_loaded_steers_away_from_a_replica_whose_gpu_is_busy() -> None:
    doc = _doc(routing="least-loaded")
    doc["processes"][0]["always_active"] = True  # train keeps gpu0 busy all run
    doc["models"][0]["replicas"][0]["weight"] = 1
    sim = Simulation(_load(doc))
    sim.run()
    served = _served(sim)
    assert served[("chat", "chat-a", "gpu0")] < served[("chat", "chat-b", "gpu1")]


def test_a_weight_change_mid_run_takes_effect_and_is_reported() -> None:
    sim = Simulation(_load(_doc()))
    sim.run_until(20)
    sim.take_requests()
    sim.controls.set_weights("chat", {"chat-a": 0})
    assert sim.controls.routing("chat")["weights"] == {"chat-a": 0, "chat-b": 1}
    assert sim.controls.routing("chat")["gpus"] == {"chat-a": "gpu0", "chat-b": "gpu1"}
    sim.run_until(21)  # requests routed before the change drain
    sim.take_requests()
    sim.run()
    served = _served(sim)
    assert served[("chat", "chat-a", "gpu0")] == 0 and served[("chat", "chat-b", "gpu1")] > 1000


@pytest.mark.parametrize(
    ("model", "weights", "why"),
    [
        ("chat", {"chat-z": 1}, "no replica 'chat-z'"),
        ("chat", {"chat-a": -1}, "bad weight -1"),
        ("chat", {"chat-a": 0, "chat-b": 0}, "none is > 0"),
        ("ocr", {"ocr": 1}, "has no replicas"),
        ("nope", {"a": 1}, "no model 'nope'"),
    ],
)
def test_bad_weight_changes_are_refused_and_change_nothing(
    model: str, weights: dict[str, int], why: str
) -> None:
    sim = Simulation(_load(_doc()))
    with pytest.raises(UsageError, match=why):
        sim.controls.set_weights(model, weights)
    assert sim.controls.routing("chat")["weights"] == {"chat-a": 3, "chat-b": 1}


def test_priority_and_rate_limit_apply_to_every_replica_of_a_model() -> None:
    sim = Simulation(_load(_doc()))
    sim.controls.set_priority("chat", 2)
    sim.controls.set_rate_limit("chat", 10.0, 1)
    sim.run()
    c = sim.take_requests()
    prios = {
        (r, p)
        for m, r, p in zip(c["model"], c["replica"], c["priority"], strict=True)
        if m == "chat"
    }
    assert prios == {("chat-a", 2), ("chat-b", 2)}
    assert 300 < sum(1 for m in c["model"] if m == "chat") < 450  # one bucket for the model


def test_replica_reaches_the_store_table_and_through_spans() -> None:
    sim = Simulation(_load(_doc()))
    sim.run_until(5)
    cols = sim.take_requests()
    table = requests_table(sim, cols)
    assert set(table.column("replica").to_pylist()) == {"chat-a", "chat-b", None}

    class Keep(SpanExporter):
        def __init__(self) -> None:
            self.spans: list[Any] = []

        def export(self, spans: Any) -> SpanExportResult:
            self.spans.extend(spans)
            return SpanExportResult.SUCCESS

    keep = Keep()
    ScenarioSpanEmitter(sim.s, keep).emit(cols)
    rows = Normalizer(GpuResolver()).normalize(encode_spans(keep.spans)).requests
    got = Counter(
        zip(rows.column("replica").to_pylist(), rows.column("pid").to_pylist(), strict=True)
    )
    want = Counter(zip(cols["replica"], cols["pid"], strict=True))
    assert got == want


def test_a_schema_4_store_gains_replica_columns_in_place(tmp_path: Path) -> None:
    path = tmp_path / "v4.duckdb"
    with Store(path) as s:
        cur = s.cursor()
        cur.execute("ALTER TABLE requests DROP COLUMN replica")
        cur.execute("ALTER TABLE incidents DROP COLUMN replica")
        cur.execute("INSERT INTO requests (model, latency_ms) VALUES ('tts', 5.0)")
        s.set_meta("schema_version", "4")
    with Store(path) as s:
        assert s.get_meta("schema_version") == str(SCHEMA_VERSION) == "9"
        rows = s.cursor().execute("SELECT model, latency_ms, replica FROM requests").fetchall()
        assert rows == [("tts", 5.0, None)]
        s.cursor().execute("SELECT replica FROM incidents").fetchall()
    con = duckdb.connect(str(path), read_only=True)
    cols = [r[0] for r in con.execute("DESCRIBE requests").fetchall()]
    con.close()
    assert cols[-1] == "replica"


def test_the_simulator_backend_reroutes_and_reverts_weights() -> None:
    from cotenant.actuators.backend import Change
    from cotenant.core.errors import BackendError
    from cotenant.evaluation.sim_backend import SimulatorBackend

    sim = Simulation(_load(_doc()))
    backend = SimulatorBackend(sim)
    before = backend.current("chat")
    assert before["weights"] == {"chat-a": 3, "chat-b": 1}
    assert "weights" not in backend.current("ocr")
    after = backend.apply(Change("reroute", "chat", {"weights": {"chat-a": 1}}))
    assert after["weights"] == {"chat-a": 1, "chat-b": 1}
    with pytest.raises(BackendError, match=r"weights: .*no replica 'x'"):
        backend.apply(Change("reroute", "chat", {"weights": {"x": 1}}))
    with pytest.raises(BackendError, match="weights: bad value"):
        backend.apply(Change("reroute", "chat", {"weights": []}))
    assert backend.revert("chat", before)["weights"] == {"chat-a": 3, "chat-b": 1}
    assert [(e.op, e.kind) for e in backend.log] == [("apply", "reroute"), ("revert", "reroute")]

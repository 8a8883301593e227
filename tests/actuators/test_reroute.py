"""The ``reroute`` action: its policy section, its plan, and the control loop driving the
bundled gateway's real control API (a model with two replicas), on a real DuckDB store and a
fake clock. Request rows go in as the collectors would leave them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from act_helpers import GW_TOKEN, FakeClock, add_incident, add_requests, free_socket
from gateway_thread import RunningGateway
from prometheus_client import CollectorRegistry

from cotenant.actuators.backends.gateway import GatewayBackend
from cotenant.actuators.backends.http import HttpCaller
from cotenant.actuators.controller import ActionController
from cotenant.actuators.policy import RerouteRule, load_policy, parse_policy
from cotenant.actuators.reroute import plan_weights
from cotenant.actuators.settings import ActuatorSettings
from cotenant.analysis.incidents import IncidentBook
from cotenant.core.errors import ConfigError
from cotenant.gateway.routing_config import ReplicaSpec, RouteSpec, RoutingSpec
from cotenant.gateway.settings import GatewaySettings
from cotenant.store.db import Store
from cotenant.store.source import StoreSource

# -- the policy -------------------------------------------------------------------------


def test_the_bundled_policy_reroutes_when_throttling_cannot_help() -> None:
    p = load_policy()
    assert p.reroute is not None and p.reroute.max_step == 0.25
    assert p.reroutes("cotenant") and p.reroutes("throttle") and not p.reroutes("lock")


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"reroute": {"max_step": 0}}, "reroute.max_step: bad value 0"),
        ({"reroute": {"min_weight": 300}}, "reroute.min_weight: bad value 300"),
        ({"reroute": {"fallback": ["weather"]}}, "reroute.fallback[0]: bad value 'weather'"),
        ({"reroute": {"fallback": "cotenant"}}, "reroute.fallback: bad value 'cotenant'"),
        ({"reroute": {"speed": 1}}, "reroute.speed: bad value 'speed': unknown key"),
        ({"causes": {"throttle": "reroute"}}, "causes.throttle.action: bad value 'reroute'"),
        (
            {"reroute": {}, "causes": {"throttle": {"action": "reroute", "target": "culprit"}}},
            "causes.throttle.target: bad value 'culprit': a reroute moves the victim",
        ),
    ],
)
def test_a_bad_reroute_policy_names_the_field(doc: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_policy({"version": 1, **doc}, "p.yaml")
    assert f"policy p.yaml: {says}" in str(err.value)


def test_no_reroute_section_never_reroutes() -> None:
    p = parse_policy({"version": 1, "causes": {"throttle": "notify"}})
    assert p.reroute is None and not p.reroutes("cotenant")


# -- the plan ---------------------------------------------------------------------------


def test_steps_move_at_most_max_step_of_the_traffic_to_the_siblings() -> None:
    rule = RerouteRule(max_step=0.25)
    assert plan_weights({"a": 1, "b": 1}, "a", ["b"], rule) == [
        {"a": 64, "b": 192},
        {"a": 0, "b": 256},
    ]
    # a third replica that is not fine keeps its share; the floor stops the last step
    steps = plan_weights({"a": 2, "b": 1, "c": 1}, "a", ["b"], RerouteRule(min_weight=32))
    assert steps == [{"a": 64, "b": 128, "c": 64}, {"a": 32, "b": 160, "c": 64}]
    assert plan_weights({"a": 0, "b": 1}, "a", ["b"], rule) == []  # nothing left to move
    assert len(plan_weights({"a": 1, "b": 0}, "a", ["b"], RerouteRule(max_steps=2))) == 2


# -- the control loop on the real gateway ------------------------------------------------

SLO = {"chat": 100.0, "embed": 50.0}
SIBLING = {
    "replica": "chat-b",
    "gpu": "gpu1",
    "p99_ms": 40.0,
    "baseline_p99_ms": 40.0,
    "slo_ms": 100.0,
    "fine": True,
}


@pytest.fixture(scope="module")
def gateway() -> Iterator[RunningGateway]:
    sock = free_socket()
    nobody = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    routing = RoutingSpec(
        replicas=(ReplicaSpec("chat-a", nobody, 1), ReplicaSpec("chat-b", nobody, 1)),
        routes={"chat": RouteSpec({"chat-a": 1, "chat-b": 1})},
    )
    gw = RunningGateway(
        GatewaySettings(
            upstream=nobody,
            token=GW_TOKEN,
            listen=("127.0.0.1", 0),
            control=("127.0.0.1", 0),
            routing=routing,
        )
    )
    yield gw
    gw.stop()


@pytest.fixture
def backend(gateway: RunningGateway) -> Iterator[GatewayBackend]:
    http = HttpCaller(
        "gateway",
        gateway.control,
        headers={"Authorization": f"Bearer {GW_TOKEN}"},
        retries=1,
        backoff_s=0.01,
    )
    b = GatewayBackend(http)
    before = b.current("chat")
    yield b
    b.revert("chat", before)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "r.duckdb")
    # chat-a on gpu0 slow from 100 s (a training job: no requests of its own); chat-b and a
    # light embedder on gpu1 fine
    add_requests(s, "chat", "gpu0", 20, 100, 10, 40)
    add_requests(s, "chat", "gpu0", 100, 130, 10, 300)
    add_requests(s, "chat", "gpu1", 20, 130, 10, 40)
    add_requests(s, "embed", "gpu1", 20, 130, 20, 10)
    add_incident(
        s,
        model="chat",
        gpu="gpu0",
        slo_ms=100.0,
        causes=[
            {"kind": "cotenant", "culprit": "train-job", "share": 0.9, "confidence": 0.9},
        ],
        replica="chat-a",
        siblings=[SIBLING],
    )
    yield s
    s.close()


def controller(store: Store, backend: GatewayBackend, mode: str, clock: FakeClock) -> Any:
    return ActionController(
        settings=ActuatorSettings(mode=mode, settle_s=20.0, ttl_s=600.0),
        policy=load_policy(),
        incidents=IncidentBook(store),
        source=StoreSource(store),
        backend=backend,
        store=store,
        token="s3cret",
        registry=CollectorRegistry(),
        clock_ns=clock,
        slo_ms=SLO,
    )


def audit(c: ActionController, action_id: str) -> list[str]:
    return [e["event"] for e in c.log.audit(action_id)]


def test_dry_run_proposes_a_reroute_for_a_culprit_without_requests_and_changes_nothing(
    store: Store, backend: GatewayBackend
) -> None:
    clock = FakeClock(130)
    c = controller(store, backend, "dry-run", clock)
    c.step(clock())
    [a] = c.list_actions()
    assert (a["kind"], a["target"], a["state"]) == ("reroute", "chat", "proposed")
    assert a["params"]["weights"] == {"chat-a": 64, "chat-b": 192}
    assert a["params"]["to"] == {"chat-b": "gpu1"} and len(a["params"]["steps"]) == 2
    assert "chat-a on gpu0 is slow while chat-b on gpu1 is fine" in a["reason"]
    c.step(clock.set(200))
    assert backend.current("chat")["weights"] == {"chat-a": 1, "chat-b": 1}
    assert audit(c, a["id"]) == ["proposed"]


def test_auto_steps_the_weights_and_verifies_once_the_model_is_back(
    store: Store, backend: GatewayBackend
) -> None:
    clock = FakeClock(130)
    c = controller(store, backend, "auto", clock)
    c.step(clock())
    [a] = c.list_actions()
    assert a["state"] == "applied"
    assert backend.current("chat")["weights"] == {"chat-a": 64, "chat-b": 192}
    # a quarter of chat still goes to the slow replica: its p99 is still out
    add_requests(store, "chat", "gpu0", 130, 141, 2.5, 300)
    add_requests(store, "chat", "gpu1", 130, 141, 17.5, 45)
    c.step(clock.set(141))
    [a] = c.list_actions()
    assert a["state"] == "applied" and a["params"]["step"] == 1
    assert backend.current("chat")["weights"] == {"chat-a": 0, "chat-b": 256}
    add_requests(store, "chat", "gpu1", 141, 152, 20, 50)
    add_requests(store, "embed", "gpu1", 130, 152, 20, 12)
    c.step(clock.set(152))
    [a] = c.list_actions()
    assert a["state"] == "verified", a["reason"]
    assert "helped: chat p99 50.0 ms" in a["reason"]
    assert audit(c, a["id"]) == ["proposed", "approved", "applied", "stepped", "verified"]
    assert a["before"]["weights"] == {"chat-a": 1, "chat-b": 1}


def test_a_step_that_pushes_another_model_over_its_slo_is_rolled_back(
    store: Store, backend: GatewayBackend
) -> None:
    clock = FakeClock(130)
    c = controller(store, backend, "auto", clock)
    c.step(clock())
    add_requests(store, "chat", "gpu0", 130, 141, 2.5, 300)
    add_requests(store, "chat", "gpu1", 130, 141, 17.5, 45)
    add_requests(store, "embed", "gpu1", 130, 141, 20, 80)  # over its 50 ms SLO
    c.step(clock.set(141))
    [a] = c.list_actions()
    assert a["state"] == "rolled_back"
    assert "embed p99 80.0 ms is over its 50 ms SLO" in a["reason"]
    assert backend.current("chat")["weights"] == {"chat-a": 1, "chat-b": 1}
    c.step(clock.set(200))  # one reroute per incident: never oscillates (a notify remains)
    assert sorted(x["kind"] for x in c.list_actions()) == ["notify", "reroute"]
    assert backend.current("chat")["weights"] == {"chat-a": 1, "chat-b": 1}


def test_no_reroute_without_a_healthy_sibling_or_headroom(
    store: Store, backend: GatewayBackend
) -> None:
    add_incident(
        store,
        model="chat",
        gpu="gpu0",
        slo_ms=100.0,
        causes=[{"kind": "cotenant", "culprit": "train-job", "share": 0.9, "confidence": 0.9}],
        replica="chat-a",
        siblings=[{**SIBLING, "fine": False}],
    )
    clock = FakeClock(130)
    c = controller(store, backend, "auto", clock)
    c.step(clock())
    [a] = c.list_actions()
    assert a["kind"] == "notify"
    assert "no reroute: chat has no healthy replica elsewhere" in a["reason"]
    add_requests(store, "embed", "gpu1", 100, 130, 20, 45)  # 45 > 0.8 x 50 ms: no headroom
    add_incident(
        store,
        id="inc-2",
        model="chat",
        gpu="gpu0",
        slo_ms=100.0,
        causes=[{"kind": "cotenant", "culprit": "train-job", "share": 0.9, "confidence": 0.9}],
        replica="chat-a",
        siblings=[SIBLING],
    )
    c.step(clock.set(131))
    [b] = [x for x in c.list_actions() if x["incident_id"] == "inc-2"]
    assert b["kind"] == "notify" and "no replica of chat has headroom: embed on gpu1" in b["reason"]
    assert backend.current("chat")["weights"] == {"chat-a": 1, "chat-b": 1}

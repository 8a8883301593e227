"""The control loop's state machine, guardrails and audit, on a real DuckDB store and a fake
clock: incidents and request rows go in as the analysis would leave them; the controller drives
the bundled gateway's real control API over HTTP, and the tests read what it applied from the
gateway's ``GET /control/v1/state``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from act_helpers import (
    FakeClock,
    LiveGateway,
    add_incident,
    add_requests,
    at,
    live_gateway,
)
from prometheus_client import CollectorRegistry

from cotenant.actuators.backend import Backend
from cotenant.actuators.controller import ActionController
from cotenant.actuators.policy import VerifyRule, load_policy
from cotenant.actuators.settings import ActuatorSettings
from cotenant.analysis.incidents import IncidentBook
from cotenant.core.errors import ActionError, BackendError, Forbidden, Unauthorized
from cotenant.store.db import Store
from cotenant.store.source import StoreSource


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "a.duckdb")
    # tts slow from 100 s; sdxl (the culprit) at 10 rps before the incident
    add_requests(s, "sdxl", "gpu0", 20, 100, 10, 200)
    add_requests(s, "sdxl", "gpu0", 100, 130, 30, 200)
    add_requests(s, "tts", "gpu0", 20, 100, 20, 40)
    add_requests(s, "tts", "gpu0", 100, 130, 20, 300)
    yield s
    s.close()


@pytest.fixture(scope="module")
def live() -> Iterator[LiveGateway]:
    with live_gateway() as gw:
        yield gw


@pytest.fixture
def gw(live: LiveGateway) -> LiveGateway:
    """The module's gateway, with no limit or priority left from an earlier test."""
    live.reset()
    assert live.changed() == {}
    return live


NOTHING = {
    "rate_rps": None,
    "burst": None,
    "priority": None,
    "weights": {"nobody": 1},  # the live gateway's one replica, in the default route
    "weights_set": False,
}


def make(
    store: Store,
    mode: str,
    clock: FakeClock,
    gw: LiveGateway,
    backend: Backend | None = None,
    **kw: Any,
) -> tuple[ActionController, LiveGateway, CollectorRegistry]:
    backend = backend or gw.backend()
    policy = kw.pop("policy", None) or load_policy()
    reg = CollectorRegistry()
    settings = ActuatorSettings(
        mode=mode,
        settle_s=kw.pop("settle_s", 20.0),
        ttl_s=kw.pop("ttl_s", 600.0),
        cooldown_s=kw.pop("cooldown_s", 300.0),
        **kw,
    )
    c = ActionController(
        settings=settings,
        policy=policy,
        incidents=IncidentBook(store),
        source=StoreSource(store),
        backend=backend,
        store=store,
        token="s3cret",
        registry=reg,
        clock_ns=clock,
        slo_ms={"tts": 100.0, "sdxl": 1000.0},
    )
    return c, gw, reg


def metric(reg: CollectorRegistry, name: str, **labels: str) -> float:
    v = reg.get_sample_value(name, labels)
    return 0.0 if v is None else v


def events(c: ActionController, action_id: str) -> list[tuple[str, str]]:
    return [(e["actor"], e["event"]) for e in c.log.audit(action_id)]


def test_dry_run_proposes_a_sized_rate_limit_and_applies_nothing(
    store: Store, gw: LiveGateway
) -> None:
    clock = FakeClock(130)
    add_incident(store)
    c, gw, reg = make(store, "dry-run", clock, gw)
    c.step(clock())
    [a] = c.list_actions()
    assert a["state"] == "proposed" and a["kind"] == "rate_limit" and a["target"] == "sdxl"
    # 10 rps before the incident x (1 - 0.8 share x 0.5 gain) = 6 rps, burst 1 s of it
    assert a["params"]["rate_rps"] == pytest.approx(6.0, rel=0.02)
    assert a["params"]["burst"] == 6
    assert "sdxl" in a["reason"] and "80%" in a["reason"]
    assert gw.changed() == {}
    with pytest.raises(ActionError, match="dry-run"):
        c.approve(a["id"], actor="alice")
    c.step(clock.set(200))  # nothing applied, however long we wait
    assert gw.changed() == {} and c.list_actions()[0]["state"] == "proposed"
    add_incident(store, state="resolved")
    c.step(clock.set(210))
    [a] = c.list_actions()
    assert a["state"] == "expired" and "resolved" in a["reason"]
    assert events(c, a["id"]) == [("controller", "proposed"), ("controller", "expired")]
    assert (
        metric(
            reg,
            "cotenant_action_transitions_total",
            kind="rate_limit",
            target="sdxl",
            state="expired",
        )
        == 1.0
    )


def test_a_degradation_within_the_slo_is_listed_not_acted_on(store: Store, gw: LiveGateway) -> None:
    clock = FakeClock(130)
    add_incident(store, severity="degradation", peak_p99_ms=80.0)
    c, gw, _ = make(store, "auto", clock, gw)
    c.step(clock())
    assert c.list_actions() == [] and gw.changed() == {}
    add_incident(store, severity="breach")  # the same slowdown crossed the SLO
    c.step(clock.set(135))
    [a] = c.list_actions()
    assert a["kind"] == "rate_limit" and a["target"] == "sdxl"


def test_auto_applies_verifies_then_reverts_at_ttl(store: Store, gw: LiveGateway) -> None:
    clock = FakeClock(130)
    add_incident(store)
    c, gw, reg = make(store, "auto", clock, gw, settle_s=20.0, ttl_s=300.0)
    c.step(clock())
    [a] = c.list_actions()
    assert a["state"] == "applied"
    assert gw.model("sdxl")["rate_rps"] == pytest.approx(6.0, rel=0.02)
    assert (
        gw.model("sdxl")
        == a["after"]
        == {**NOTHING, "rate_rps": a["params"]["rate_rps"], "burst": 6}
    )
    assert a["before"] == NOTHING
    assert metric(reg, "cotenant_actions_active", target="sdxl") == 1.0
    # the limit works: tts back to 45 ms
    add_requests(store, "tts", "gpu0", 130, 160, 20, 45)
    c.step(clock.set(140))  # before settle_s: still applied
    assert c.list_actions()[0]["state"] == "applied"
    c.step(clock.set(151))
    [a] = c.list_actions()
    assert a["state"] == "verified", a["reason"]
    assert a["victim_p99_after_ms"] == pytest.approx(45.0, rel=0.05)
    assert a["victim_p99_before_ms"] == pytest.approx(300.0, rel=0.05)
    c.step(clock.set(431))  # ttl_s after applying: reverted
    [a] = c.list_actions()
    assert a["state"] == "expired" and "ttl" in a["reason"]
    assert gw.model("sdxl") == NOTHING and gw.changed() == {}
    assert metric(reg, "cotenant_actions_active", target="sdxl") == 0.0
    assert [e for _, e in events(c, a["id"])] == [
        "proposed",
        "approved",
        "applied",
        "verified",
        "expired",
    ]
    trail = c.log.audit(a["id"])
    applied = next(e for e in trail if e["event"] == "applied")["detail"]
    assert applied["before"]["rate_rps"] is None and applied["after"]["rate_rps"] > 0
    for state in ("proposed", "approved", "applied", "verified", "expired"):
        assert (
            metric(
                reg,
                "cotenant_action_transitions_total",
                kind="rate_limit",
                target="sdxl",
                state=state,
            )
            == 1.0
        )


def test_a_change_that_does_not_help_is_rolled_back_with_the_numbers(
    store: Store, gw: LiveGateway
) -> None:
    clock = FakeClock(130)
    add_incident(store)
    c, gw, reg = make(store, "auto", clock, gw)
    c.step(clock())
    add_requests(store, "tts", "gpu0", 130, 160, 20, 280)  # still slow
    c.step(clock.set(151))
    [a] = c.list_actions()
    assert a["state"] == "rolled_back"
    assert "did not help" in a["reason"] and "280" in a["reason"] and "100" in a["reason"]
    assert gw.model("sdxl") == NOTHING and gw.changed() == {}  # reverted on the gateway
    rolled = next(e for e in c.log.audit(a["id"]) if e["event"] == "rolled_back")["detail"]
    assert rolled["restored"] == NOTHING
    assert (
        metric(
            reg,
            "cotenant_action_transitions_total",
            kind="rate_limit",
            target="sdxl",
            state="rolled_back",
        )
        == 1.0
    )
    # never retried on the same incident: no oscillation
    c.step(clock.set(160))
    assert len(c.list_actions()) == 1


@pytest.mark.parametrize(("hurt_ratio", "state"), [(1.0, "rolled_back"), (3.0, "verified")])
def test_a_change_that_hurts_the_culprit_more_than_it_helps_is_rolled_back(
    store: Store, gw: LiveGateway, hurt_ratio: float, state: str
) -> None:
    """Rolled back when the culprit's hurt > culprit_hurt_ratio x the victim's gain: here the
    hurt is 4.0 (sdxl 5x over its SLO) against a smaller gain, so a ratio of 3 keeps it."""
    clock = FakeClock(130)
    add_incident(store)
    policy = dataclasses.replace(load_policy(), verify=VerifyRule(culprit_hurt_ratio=hurt_ratio))
    c, _, _ = make(store, "auto", clock, gw, policy=policy)
    c.step(clock())
    add_requests(store, "tts", "gpu0", 130, 160, 20, 90)  # just under its SLO
    add_requests(store, "sdxl", "gpu0", 130, 160, 6, 5000)  # 5x over its own SLO
    c.step(clock.set(151))
    [a] = c.list_actions()
    assert a["state"] == state, a["reason"]
    if state == "rolled_back":
        assert "hurt more than it helped" in a["reason"]


def test_manual_mode_waits_for_a_person_and_records_who(store: Store, gw: LiveGateway) -> None:
    clock = FakeClock(130)
    add_incident(store)
    c, gw, _ = make(store, "manual", clock, gw)
    c.step(clock())
    c.step(clock.set(140))
    [a] = c.list_actions()
    assert a["state"] == "proposed" and gw.changed() == {}
    out = c.approve(a["id"], actor="alice")
    assert out["state"] == "applied" and gw.model("sdxl")["burst"] == 6
    assert ("alice", "approved") in events(c, a["id"])
    with pytest.raises(ActionError, match="applied"):
        c.approve(a["id"], actor="alice")
    out = c.rollback(a["id"], actor="bob", reason="wrong culprit")
    assert (
        out["state"] == "rolled_back"
        and "bob" in out["reason"]
        and "wrong culprit" in out["reason"]
    )
    assert ("bob", "rolled_back") in events(c, a["id"])
    assert gw.model("sdxl") == NOTHING


def test_never_two_changes_to_one_target_and_cooldown(store: Store, gw: LiveGateway) -> None:
    clock = FakeClock(130)
    add_incident(store)
    add_incident(store, id="inc-2", model="asr")  # a second victim blames sdxl too
    c, gw, _ = make(store, "auto", clock, gw, cooldown_s=300.0)
    c.step(clock())
    acts = c.list_actions()
    assert [a["target"] for a in acts] == ["sdxl"]  # one change on sdxl, not two
    assert [a["state"] for a in acts] == ["applied"]
    assert gw.changed().keys() == {"sdxl"}
    assert gw.model("sdxl")["rate_rps"] == acts[0]["params"]["rate_rps"]
    c.rollback(acts[0]["id"], actor="bob", reason="test")
    c.step(clock.set(140))  # inc-2 now gets its proposal, but sdxl is cooling down
    held = [a for a in c.list_actions() if a["incident_id"] == "inc-2"]
    assert len(held) == 1 and held[0]["state"] == "approved"
    assert "cooling down" in held[0]["reason"]
    assert ("controller", "held") in events(c, held[0]["id"])
    c.step(clock.set(141))  # still held: the audit does not repeat itself
    assert events(c, held[0]["id"]).count(("controller", "held")) == 1
    assert gw.changed() == {}  # held: nothing on the gateway
    c.step(clock.set(131 + 300 + 1))
    assert next(a for a in c.list_actions() if a["incident_id"] == "inc-2")["state"] == "applied"
    assert gw.changed().keys() == {"sdxl"}


def test_hourly_limits(store: Store, gw: LiveGateway) -> None:
    clock = FakeClock(130)
    add_incident(store)
    add_incident(
        store,
        id="inc-2",
        model="asr",
        causes=[{"kind": "bandwidth", "culprit": "tts", "share": 0.9, "confidence": 0.9}],
    )
    c, _, _ = make(store, "auto", clock, gw, max_actions_per_hour=1)
    c.step(clock())
    states = sorted((a["target"], a["state"]) for a in c.list_actions())
    assert states == [("sdxl", "applied"), ("tts", "approved")]
    held = next(a for a in c.list_actions() if a["target"] == "tts")
    assert "max_actions_per_hour" in held["reason"]
    assert gw.changed().keys() == {"sdxl"}  # tts is not limited


def test_backend_failure_fails_the_action_and_changes_nothing(
    store: Store, gw: LiveGateway
) -> None:
    """The gateway refuses the actuator (its token was rotated): the action fails, with the
    gateway's answer in its reason, and the gateway is left as it was."""
    clock = FakeClock(130)
    add_incident(store)
    c, gw, reg = make(store, "auto", clock, gw, backend=gw.backend(token="rotated-away"))
    c.step(clock())
    [a] = c.list_actions()
    assert a["state"] == "failed" and "apply failed" in a["reason"] and "refused" in a["reason"]
    assert "403" in a["reason"] and gw.control in a["reason"]
    assert "rotated-away" not in a["reason"]
    assert gw.model("sdxl") == NOTHING and gw.changed() == {}
    assert metric(reg, "cotenant_actions_active", target="sdxl") == 0.0


def test_a_revert_that_fails_keeps_the_change_and_says_so(store: Store, gw: LiveGateway) -> None:
    clock = FakeClock(130)
    add_incident(store)
    with live_gateway() as own:  # its own gateway: this test stops it
        c, _, _ = make(store, "manual", clock, gw, backend=own.backend())
        c.step(clock())
        a = c.approve(c.list_actions()[0]["id"], actor="alice")
        assert a["state"] == "applied" and own.model("sdxl")["burst"] == 6
        own.stop()  # the gateway goes down with the limit in place
        with pytest.raises(BackendError, match="cannot connect") as e:
            c.rollback(a["id"], actor="bob", reason="test")
    assert own.control in str(e.value)
    assert c.log.get(a["id"]).state == "applied"
    assert ("bob", "revert_failed") in events(c, a["id"])
    failed = next(x for x in c.log.audit(a["id"]) if x["event"] == "revert_failed")["detail"]
    assert "cannot connect" in failed["error"] and failed["wanted"] == "rolled_back"


def test_notify_only_causes_and_thresholds(store: Store, gw: LiveGateway) -> None:
    clock = FakeClock(130)
    add_incident(
        store, causes=[{"kind": "throttle", "culprit": "gpu0", "share": 0.9, "confidence": 0.9}]
    )
    add_incident(
        store,
        id="inc-2",
        model="asr",
        causes=[{"kind": "cotenant", "culprit": "sdxl", "share": 0.1, "confidence": 0.9}],
    )
    c, gw, _ = make(store, "auto", clock, gw)
    c.step(clock())
    acts = {a["incident_id"]: a for a in c.list_actions()}
    assert acts["inc-1"]["kind"] == "notify" and "notify only" in acts["inc-1"]["reason"]
    assert acts["inc-2"]["kind"] == "notify" and "below the policy" in acts["inc-2"]["reason"]
    assert gw.changed() == {}
    with pytest.raises(ActionError, match="nothing to approve"):
        c.approve(acts["inc-1"]["id"], actor="alice")


def test_a_culprit_without_requests_cannot_be_rate_limited(store: Store, gw: LiveGateway) -> None:
    clock = FakeClock(130)
    add_incident(
        store,
        causes=[{"kind": "cotenant", "culprit": "train-job", "share": 0.9, "confidence": 0.9}],
    )
    c, _, _ = make(store, "auto", clock, gw)
    c.step(clock())
    [a] = c.list_actions()
    assert a["kind"] == "notify" and "served no requests" in a["reason"]


def test_state_survives_a_restart(store: Store, gw: LiveGateway) -> None:
    clock = FakeClock(130)
    add_incident(store)
    c, gw, _ = make(store, "auto", clock, gw)
    c.step(clock())
    add_requests(store, "tts", "gpu0", 130, 160, 20, 45)
    c2 = ActionController(
        settings=c.settings,
        policy=c.policy,
        incidents=IncidentBook(store),
        source=StoreSource(store),
        backend=gw.backend(),
        store=store,
        clock_ns=clock,
        slo_ms={"tts": 100.0},
    )
    c2.step(clock.set(151))
    assert c2.list_actions()[0]["state"] == "verified"


def test_authorize() -> None:
    c = ActionController.__new__(ActionController)
    c._token = "s3cret"
    with pytest.raises(Unauthorized):
        c.authorize(None)
    with pytest.raises(Forbidden) as e:
        c.authorize("nope")
    assert "nope" not in str(e.value) and "s3cret" not in str(e.value)
    c.authorize("s3cret")
    c._token = ""
    with pytest.raises(Forbidden, match="no token is configured"):
        c.authorize("anything")


def test_list_filters(store: Store, gw: LiveGateway) -> None:
    clock = FakeClock(130)
    add_incident(store)
    add_incident(
        store,
        id="inc-2",
        model="asr",
        causes=[{"kind": "memory", "culprit": "x", "share": 0.9, "confidence": 0.9}],
    )
    c, _, _ = make(store, "dry-run", clock, gw)
    c.step(clock())
    assert {a["incident_id"] for a in c.list_actions()} == {"inc-1", "inc-2"}
    assert [a["incident_id"] for a in c.list_actions(incident_id="inc-2")] == ["inc-2"]
    assert c.list_actions(since_ns=at(131)) == []
    assert len(c.list_actions(limit=1)) == 1


def test_the_thread_steps_on_its_clock_and_stops(store: Store, gw: LiveGateway) -> None:
    clock = FakeClock(130)
    add_incident(store)
    c, _, _ = make(store, "dry-run", clock, gw, interval_s=0.01)
    c.start()
    try:
        deadline = time.monotonic() + 20
        while c.passes < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        c.stop()
    assert c.passes >= 3
    [a] = c.list_actions()
    assert a["state"] == "proposed" and a["created_ns"] == at(130)
    n = c.passes
    time.sleep(0.05)
    assert c.passes == n  # stopped


class RecordingNotifier:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def notify(self, payload: dict[str, Any]) -> None:
        self.sent.append(payload)


@pytest.mark.parametrize(("mode", "sent"), [("dry-run", 0), ("manual", 1), ("auto", 1)])
def test_notify_actions_reach_the_notifier_outside_dry_run(
    store: Store, gw: LiveGateway, mode: str, sent: int
) -> None:
    clock = FakeClock(130)
    add_incident(
        store, causes=[{"kind": "memory", "culprit": "chat", "share": 0.7, "confidence": 0.8}]
    )
    notifier = RecordingNotifier()
    c = ActionController(
        settings=ActuatorSettings(mode=mode),
        policy=load_policy(),
        incidents=IncidentBook(store),
        source=StoreSource(store),
        backend=gw.backend(),
        store=store,
        clock_ns=clock,
        notifier=notifier,
    )
    c.step(clock())
    assert len(notifier.sent) == sent and gw.changed() == {}
    if sent:
        assert notifier.sent[0]["action"]["kind"] == "notify"
        assert notifier.sent[0]["action"]["target"] == "chat"
        assert ("controller", "notified") in events(c, c.list_actions()[0]["id"])


def test_a_firmer_diagnosis_replaces_the_notification(store: Store, gw: LiveGateway) -> None:
    clock = FakeClock(120)
    add_incident(
        store, causes=[{"kind": "unknown", "culprit": "", "share": 0.6, "confidence": 0.2}]
    )
    c, gw, _ = make(store, "auto", clock, gw)
    c.step(clock())
    c.step(clock.set(125))  # the same diagnosis: still one notification
    [n] = c.list_actions()
    assert n["kind"] == "notify" and n["state"] == "proposed"
    add_incident(store)  # the incident grew and now names sdxl
    c.step(clock.set(130))
    acts = {a["kind"]: a for a in c.list_actions()}
    assert acts["notify"]["state"] == "expired" and "superseded" in acts["notify"]["reason"]
    assert acts["rate_limit"]["state"] == "applied" and gw.model("sdxl")["burst"] == 6


def test_a_past_range_lists_the_incidents_and_actions_it_overlaps_only(
    store: Store, gw: LiveGateway
) -> None:
    """What the dashboard's fixed ranges read: filtered in the store, before the limit (a range
    in the past must not lose its incidents to newer ones)."""
    add_incident(store, id="old", start_s=100, end_s=130)
    for k in range(3):  # newer incidents, after the range
        add_incident(store, id=f"new-{k}", start_s=1000 + k, end_s=1010 + k)
    book = IncidentBook(store)
    assert [i.id for i in book.find(since_ns=at(90), until_ns=at(200), limit=1)] == ["old"]
    assert {i.id for i in book.find(since_ns=at(90), limit=10)} == {
        "old",
        "new-0",
        "new-1",
        "new-2",
    }
    clock = FakeClock(130)
    c, _, _ = make(store, "dry-run", clock, gw)
    c.step(clock())
    acts = c.list_actions()  # one proposal per open incident, all created at 130 s
    assert acts and {a["created_ns"] for a in acts} == {at(130)}
    assert c.list_actions(since_ns=at(0), until_ns=at(200)) == acts
    assert c.list_actions(since_ns=at(0), until_ns=at(130)) == []  # created after the range

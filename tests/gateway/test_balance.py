"""The routing policies and passive health on their own (no sockets): shares by weight over
many requests for every policy, round robin's interleaving, health's ejection and probing."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from cotenant.gateway.balance import POLICIES, NoReplica, Policy, Route
from cotenant.gateway.health import PassiveHealth
from cotenant.gateway.replica import Replica, Reservation


def _route(policy: Policy, weights: dict[str, int], seed: int = 7) -> tuple[Route, list[Replica]]:
    replicas = [Replica(n, f"http://{n}:1") for n in weights]
    return Route(
        policy, dict(zip(replicas, weights.values(), strict=True)), random.Random(seed)
    ), replicas


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_policy_shares_idle_replicas_by_weight(policy: Policy, seed: int) -> None:
    route, _ = _route(policy, {"a": 6, "b": 3, "c": 1, "off": 0}, seed)
    got = Counter(route.pick(0, 0.0).name for _ in range(10_000))  # type: ignore[union-attr]
    assert "off" not in got
    for name, share in (("a", 0.6), ("b", 0.3), ("c", 0.1)):
        assert abs(got[name] / 10_000 - share) < 0.03, got


def test_round_robin_interleaves() -> None:
    route, _ = _route("weighted", {"a": 5, "b": 1, "c": 1})
    picks = "".join(route.pick(0, 0.0).name for _ in range(7))  # type: ignore[union-attr]
    assert picks == "aabacaa"


@pytest.mark.parametrize("policy", POLICIES)
def test_full_and_ejected_replicas_are_skipped(policy: Policy) -> None:
    route, (a, b) = _route(policy, {"a": 1, "b": 1})
    a.max_in_flight = 1
    a.take(0)
    assert {route.pick(0, 0.0) for _ in range(20)} == {b}
    b.eject(0.0, 10.0)
    assert route.pick(0, 1.0) is None  # a is full: wait
    a.give_back(False)
    assert route.pick(0, 1.0) is a
    a.eject(0.0, None)
    with pytest.raises(NoReplica):
        route.pick(0, 1.0)
    assert route.pick(0, 11.0) is b  # b's ejection had a time limit


def test_reservation_caps_the_other_classes() -> None:
    r = Replica("g", "http://g:1", max_in_flight=4, reservation=Reservation(2, 0))
    assert [r.take(10)[0] for _ in range(2)] == [False, False]
    assert not r.has_room(10) and r.has_room(0)  # the other two slots are kept
    assert [r.take(p)[0] for p in (0, -5)] == [True, True]
    assert not r.has_room(0)  # every slot in use
    r.give_back(True)
    assert r.has_room(0) and not r.has_room(10)  # the others still hold their two
    r.give_back(False)
    assert r.has_room(10)


def test_health_ejects_doubles_and_probes_back() -> None:
    h = PassiveHealth(eject_after=3, eject_s=10.0, max_eject_s=25.0)
    assert not h.failed(0.0, h.sent()) and not h.failed(0.0, h.sent())
    h.succeeded(h.sent())  # a success in between resets the count
    assert [h.failed(1.0, h.sent()) for _ in range(3)] == [False, False, True]
    assert not h.available(10.9) and h.available(11.0) and h.state == "probing"
    probe = h.sent()
    assert probe and not h.available(11.0)  # one probe at a time
    assert h.failed(12.0, probe)  # the probe failed: ejected for twice as long
    assert h.ejected_for_s(12.0) == 20.0
    assert h.available(32.0)
    h.failed(32.0, h.sent())
    assert h.ejected_for_s(32.0) == 25.0  # capped
    assert h.available(57.0)
    h.succeeded(h.sent())
    assert h.state == "healthy" and h.available(57.0)
    assert h.ejections_total == 3


def test_health_off_never_ejects() -> None:
    h = PassiveHealth(eject_after=0)
    assert not any(h.failed(0.0, h.sent()) for _ in range(100))
    assert h.available(0.0)

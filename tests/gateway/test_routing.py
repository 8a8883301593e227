"""Routing across replicas over real HTTP: weights, least-loaded, passive health, ejection,
reservations, and the control API that changes them (contract 4)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from cotenant.gateway.routing_config import ReplicaSpec, RouteSpec, RoutingSpec
from tests.gateway.conftest import RunningGateway, auth, state, wait_until
from tests.gateway.replicas import ReplicaServers

Start = Callable[..., RunningGateway]


def _routing(servers: ReplicaServers, names: dict[str, int], **kw: Any) -> RoutingSpec:
    """Replicas ``name: weight`` (in the default route) on new stand-in servers."""
    replicas = tuple(ReplicaSpec(n, servers.add(n), weight=w) for n, w in names.items())
    return RoutingSpec(replicas=replicas, **kw)


def _served_by(gw: RunningGateway, n: int, model: str = "llama") -> Counter[str]:
    """Send ``n`` requests one after the other; which replica answered each."""
    got: Counter[str] = Counter()
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        for _ in range(n):
            r = client.post("/v1/completions", json={"model": model})
            assert r.status_code == 200, r.text
            got[r.json()["replica"]] += 1
    return got


def _hold(gw: RunningGateway, n: int, model: str = "llama", **kw: Any) -> list[threading.Thread]:
    """``n`` requests that the replicas keep in flight (``/hold``) until released."""
    results: list[int] = []

    def one() -> None:
        r = httpx.post(f"{gw.url}/v1/hold", json={"model": model, **kw}, timeout=30)
        results.append(r.status_code)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def _put(gw: RunningGateway, path: str, body: Any) -> httpx.Response:
    return httpx.put(f"{gw.control}/control/v1/{path}", json=body, headers=auth(), timeout=5)


def _delete(gw: RunningGateway, path: str) -> httpx.Response:
    return httpx.delete(f"{gw.control}/control/v1/{path}", headers=auth(), timeout=5)


# -- weighted ------------------------------------------------------------------------------


def test_weighted_shares_requests_by_weight(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    gw = start_gateway(routing=_routing(replica_servers, {"a": 5, "b": 2, "c": 1}))
    assert _served_by(gw, 80) == {"a": 50, "b": 20, "c": 10}
    st = state(gw)
    assert st["routes"]["*"] == {
        "policy": "weighted",
        "weights": {"a": 5, "b": 2, "c": 1},
        "configured_weights": {"a": 5, "b": 2, "c": 1},
        "overridden": False,
    }
    assert {n: r["sent_total"] for n, r in st["replicas"].items()} == {"a": 50, "b": 20, "c": 10}


def test_weights_set_through_the_control_api_move_traffic_and_clear_back(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    routing = _routing(replica_servers, {"a": 1, "b": 1})
    gw = start_gateway(routing=routing)
    assert _served_by(gw, 10) == {"a": 5, "b": 5}
    r = _put(gw, "weights/llama", {"weights": {"a": 0, "b": 3}})
    assert r.status_code == 200
    assert r.json() == {
        "model": "llama",
        "policy": "weighted",
        "weights": {"a": 0, "b": 3},
        "configured_weights": {"a": 1, "b": 1},
        "overridden": True,
    }
    assert _served_by(gw, 10) == {"b": 10}
    assert _served_by(gw, 10, model="sdxl") == {"a": 5, "b": 5}  # other models: default route
    got = httpx.get(f"{gw.control}/control/v1/routes/llama", headers=auth()).json()
    assert got["weights"] == {"a": 0, "b": 3}
    for _ in range(2):  # idempotent
        r = _delete(gw, "weights/llama")
        assert r.status_code == 200 and r.json()["overridden"] is False
    assert _served_by(gw, 10) == {"a": 5, "b": 5}
    # the default route ("*") for every model without its own
    assert _put(gw, "weights/*", {"weights": {"b": 0}}).status_code == 200
    assert _served_by(gw, 4, model="sdxl") == {"a": 4}


def test_a_configured_route_per_model(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    routing = _routing(
        replica_servers,
        {"a": 1, "b": 1, "quiet": 0},
        routes={"victim": RouteSpec({"quiet": 3, "a": 1})},
    )
    gw = start_gateway(routing=routing)
    assert _served_by(gw, 8, model="victim") == {"quiet": 6, "a": 2}
    assert _served_by(gw, 8, model="other") == {"a": 4, "b": 4}  # weight 0: not in default


# -- least-loaded --------------------------------------------------------------------------


def test_least_loaded_balances_requests_in_flight_by_weight(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    gw = start_gateway(routing=_routing(replica_servers, {"a": 3, "b": 1}, policy="least-loaded"))
    threads = _hold(gw, 8)
    wait_until(
        lambda: replica_servers.in_flight("a") + replica_servers.in_flight("b") == 8,
        what="8 requests held",
    )
    assert (replica_servers.in_flight("a"), replica_servers.in_flight("b")) == (6, 2)
    replica_servers.release()
    for t in threads:
        t.join(20)


def test_least_loaded_steers_around_a_stuck_replica(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    """A replica still holding a request gets no new ones while another is idle (a weighted
    route would give it every other request)."""
    routing = _routing(replica_servers, {"stuck": 1, "ok": 1}, policy="least-loaded")
    gw = start_gateway(routing=routing)
    threads = _hold(gw, 2)  # one on each replica: 0/0, then 1/0
    wait_until(
        lambda: replica_servers.in_flight("stuck") == replica_servers.in_flight("ok") == 1,
        what="one request held on each replica",
    )
    replica_servers.replicas["ok"].hold.set()  # "ok" answers; "stuck" keeps its request
    wait_until(lambda: replica_servers.in_flight("ok") == 0, what="ok idle")
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        replicas = [
            client.post("/v1/hold", json={"model": "llama"}).json()["replica"] for _ in range(20)
        ]
    assert replicas == ["ok"] * 20
    replica_servers.release()
    for t in threads:
        t.join(20)


# -- passive health ------------------------------------------------------------------------


def test_a_refusing_replica_is_ejected_then_probed_back(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    replicas = (
        ReplicaSpec("down", replica_servers.add("down", listening=False)),
        ReplicaSpec("up", replica_servers.add("up")),
    )
    gw = start_gateway(routing=RoutingSpec(replicas, eject_after=2, eject_s=0.2))
    # every request succeeds: a refused connection is retried on the other replica
    assert _served_by(gw, 6) == {"up": 6}
    st = state(gw)["replicas"]["down"]
    assert st["state"] == "ejected" and st["ejected_by"] == "health"
    assert st["failed_total"] == 2 and st["ejections_total"] == 1
    replica_servers.start("down")  # it comes back; after the ejection time a probe finds it
    wait_until(lambda: _served_by(gw, 1)["down"] == 1, what="a request served by 'down'")
    st = state(gw)["replicas"]["down"]
    assert st["state"] == "healthy" and st["ejected_by"] is None
    assert _served_by(gw, 10) == {"down": 5, "up": 5}


def test_a_replica_that_times_out_is_ejected(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    gw = start_gateway(
        routing=_routing(replica_servers, {"slow": 1, "fast": 1}, eject_after=2, eject_s=60),
        read_timeout_s=0.3,
    )
    replica_servers.replicas["fast"].hold.set()  # only "slow" keeps /hold requests
    codes = Counter(
        httpx.post(f"{gw.url}/v1/hold", json={"model": "llama"}, timeout=10).status_code
        for _ in range(6)
    )
    assert codes == {504: 2, 200: 4}  # two timeouts, then "slow" is out of rotation
    st = state(gw)["replicas"]
    assert st["slow"]["state"] == "ejected" and st["fast"]["state"] == "healthy"
    r = _delete(gw, "ejections/slow")  # an operator puts it back at once
    assert r.status_code == 200 and r.json()["state"] == "healthy"


def test_only_replica_down_answers_502(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    replicas = (ReplicaSpec("down", replica_servers.add("down", listening=False)),)
    gw = start_gateway(routing=RoutingSpec(replicas, eject_after=1))
    for _ in range(3):  # ejected, but it is all there is: requests still try it
        r = httpx.post(f"{gw.url}/v1/completions", json={"model": "llama"}, timeout=10)
        assert r.status_code == 502 and "cannot connect to upstream" in r.json()["error"]


# -- ejection by an operator ---------------------------------------------------------------


def test_eject_and_restore_through_the_control_api(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    gw = start_gateway(routing=_routing(replica_servers, {"a": 1, "b": 1}))
    r = _put(gw, "ejections/a", {})
    assert r.status_code == 200
    assert r.json()["state"] == "ejected" and r.json()["ejected_by"] == "operator"
    assert r.json()["ejected_for_s"] is None
    assert _served_by(gw, 6) == {"b": 6}
    _put(gw, "ejections/b", {"duration_s": 600})
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": "llama"}, timeout=10)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "no replica may take requests for model 'llama'" in r.json()["error"]
    assert _delete(gw, "ejections/a").json()["state"] == "healthy"
    assert _served_by(gw, 4) == {"a": 4}
    assert state(gw)["replicas"]["b"]["ejected_for_s"] > 500


def test_waiting_requests_follow_a_weight_change(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    """Requests queued for a full replica go to the replica the new weights name."""
    routing = RoutingSpec(
        (
            ReplicaSpec("a", replica_servers.add("a"), max_in_flight=1),
            ReplicaSpec("b", replica_servers.add("b"), weight=0),
        )
    )
    gw = start_gateway(routing=routing)
    threads = _hold(gw, 3)
    wait_until(lambda: state(gw)["models"].get("llama", {}).get("queued") == 2, what="2 queued")
    replica_servers.replicas["b"].hold.set()
    _put(gw, "weights/llama", {"weights": {"a": 0, "b": 1}})
    wait_until(lambda: replica_servers.served["b"] == 2, what="the waiting two sent to b")
    replica_servers.release()
    for t in threads:
        t.join(20)


# -- reservations --------------------------------------------------------------------------


def test_a_reservation_keeps_slots_for_the_priority_class(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    routing = RoutingSpec(
        (
            ReplicaSpec(
                "gpu0", replica_servers.add("gpu0"), max_in_flight=4, reserve_slots=2,
                reserve_priority=0,
            ),
        )
    )  # fmt: skip
    gw = start_gateway(routing=routing)
    _put(gw, "priority/batch", {"priority": 10})
    _put(gw, "priority/victim", {"priority": 0})
    low = _hold(gw, 6, model="batch")  # a burst of low-priority work
    wait_until(lambda: state(gw)["models"].get("batch", {}).get("queued") == 4, what="4 queued")
    # the two admitted requests may still be on their way to the replica: wait for them, then
    # the other two slots stay free (the gateway holds the rest back)
    wait_until(lambda: replica_servers.in_flight("gpu0") == 2, what="2 low in flight")
    assert state(gw)["models"]["batch"]["in_flight"] == 2
    assert replica_servers.in_flight("gpu0") == 2
    high = _hold(gw, 2, model="victim")
    wait_until(lambda: replica_servers.in_flight("gpu0") == 4, what="victim requests in flight")
    st = state(gw)
    assert st["models"]["victim"]["in_flight"] == 2 and st["models"]["victim"]["queued"] == 0
    assert st["replicas"]["gpu0"]["reservation"] == {"slots": 2, "priority": 0}
    r = _delete(gw, "reservations/gpu0")
    assert r.status_code == 200 and r.json()["reservation"] is None
    replica_servers.release()
    for t in low + high:
        t.join(20)


def test_reservation_set_through_the_control_api(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    routing = RoutingSpec((ReplicaSpec("gpu0", replica_servers.add("gpu0"), max_in_flight=2),))
    gw = start_gateway(routing=routing)
    _put(gw, "priority/batch", {"priority": 5})
    r = _put(gw, "reservations/gpu0", {"slots": 1, "priority": 0})
    assert r.status_code == 200 and r.json()["reservation"] == {"slots": 1, "priority": 0}
    low = _hold(gw, 3, model="batch")
    wait_until(lambda: state(gw)["models"].get("batch", {}).get("queued") == 2, what="queued")
    assert replica_servers.in_flight("gpu0") == 1
    # the victim (default priority 0) gets the kept slot at once
    replica_servers.replicas["gpu0"].hold.set()
    r = httpx.post(f"{gw.url}/v1/completions", json={"model": "victim"}, timeout=10)
    assert r.status_code == 200
    for t in low:
        t.join(20)


# -- control API: auth and bad input -------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/control/v1/routes/llama", None),
        ("PUT", "/control/v1/weights/llama", {"weights": {"a": 1}}),
        ("DELETE", "/control/v1/weights/llama", None),
        ("PUT", "/control/v1/ejections/a", {}),
        ("DELETE", "/control/v1/ejections/a", None),
        ("PUT", "/control/v1/reservations/a", {"slots": 1, "priority": 0}),
        ("DELETE", "/control/v1/reservations/a", None),
    ],
)
def test_routing_calls_need_the_bearer_token(
    start_gateway: Start, replica_servers: ReplicaServers, method: str, path: str, body: object
) -> None:
    routing = RoutingSpec((ReplicaSpec("a", replica_servers.add("a"), max_in_flight=4),))
    gw = start_gateway(routing=routing)
    url = gw.control + path
    assert httpx.request(method, url, json=body).status_code == 401
    assert httpx.request(method, url, json=body, headers=auth("wrong")).status_code == 403
    assert state(gw)["replicas"]["a"]["state"] == "healthy"  # nothing changed
    assert httpx.request(method, url, json=body, headers=auth()).status_code == 200


W = "weights/llama"
R = "reservations/"


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        (W, {"weights": {"zz": 1}}, 422, "field 'weights.zz': no replica named 'zz'"),
        (W, {"weights": {"a": -1}}, 422, "field 'weights.a' must be an integer from 0 to 256"),
        (W, {"weights": {"a": 257}}, 422, "field 'weights.a' must be an integer from 0"),
        (W, {"weights": {"a": 1.5}}, 422, "field 'weights.a' must be an integer, not float"),
        (W, {"weights": {"a": True}}, 422, "field 'weights.a' must be an integer, not bool"),
        (W, {"weights": {"a": 0, "b": 0}}, 422, "at least one replica of 'llama' must keep"),
        (W, {"weights": {}}, 422, "field 'weights' must name at least one replica"),
        (W, {"weights": [1]}, 422, "field 'weights' must be an object"),
        (W, {"a": 1}, 422, "field 'weights' is required"),
        (W, {"weights": {"a": 1}, "x": 1}, 422, "field 'x' is not allowed"),
        ("ejections/zz", {}, 404, "no replica named 'zz'"),
        ("ejections/a", {"duration_s": 0}, 422, "field 'duration_s' must be a finite number > 0"),
        ("ejections/a", {"duration_s": "1"}, 422, "field 'duration_s' must be a number, not str"),
        ("ejections/a", {"until": 1}, 422, "field 'until' is not allowed"),
        (R + "a", {"slots": 1, "priority": 0}, 422, "replica 'a' has no max_in_flight"),
        (R + "b", {"slots": 9, "priority": 0}, 422, "field 'slots' 9 is more than"),
        (R + "b", {"slots": -1, "priority": 0}, 422, "field 'slots' must be an integer >= 0"),
        (R + "b", {"slots": 1}, 422, "field 'priority' is required"),
        (R + "b", {"slots": 1, "priority": "x"}, 422, "field 'priority' must be an integer"),
    ],
)  # fmt: skip
def test_bad_routing_calls_are_refused_naming_the_field(
    start_gateway: Start,
    replica_servers: ReplicaServers,
    path: str,
    body: object,
    status: int,
    needle: str,
) -> None:
    routing = RoutingSpec(
        (
            ReplicaSpec("a", replica_servers.add("a")),
            ReplicaSpec("b", replica_servers.add("b"), max_in_flight=4),
        )
    )
    gw = start_gateway(routing=routing)
    before = state(gw)
    r = _put(gw, path, body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]
    after = state(gw)
    assert (after["routes"], after["replicas"]) == (before["routes"], before["replicas"])

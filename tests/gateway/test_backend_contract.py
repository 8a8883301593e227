"""Contract 4 end to end: the actuator's gateway backend drives a real gateway."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from cotenant.actuators.backend import Change
from cotenant.actuators.backends.gateway import GatewayBackend
from cotenant.actuators.backends.http import HttpCaller
from cotenant.core.errors import BackendError
from cotenant.gateway.routing_config import ReplicaSpec, RoutingSpec
from tests.gateway.conftest import TOKEN, RunningGateway
from tests.gateway.replicas import ReplicaServers

Start = Callable[..., RunningGateway]


def _backend(gw: RunningGateway) -> GatewayBackend:
    return GatewayBackend(
        HttpCaller("gateway", gw.control, headers={"Authorization": f"Bearer {TOKEN}"})
    )


def test_backend_applies_and_reverts_a_limit_and_a_priority(start_gateway: Start) -> None:
    gw = start_gateway()
    model = "meta-llama/Llama-3.1-8B-Instruct"
    backend = _backend(gw)
    before = backend.current(model)
    (replica,) = before["weights"]
    assert before == {
        "rate_rps": None,
        "burst": None,
        "priority": None,
        "weights": {replica: 1},
        "weights_set": False,
    }
    after = backend.apply(Change("rate_limit", model, {"rate_rps": 0.5, "burst": 1}))
    assert after == {**before, "rate_rps": 0.5, "burst": 1}
    backend.apply(Change("priority", model, {"priority": 7}))
    codes = [
        httpx.post(f"{gw.url}/v1/completions", json={"model": model}).status_code for _ in range(2)
    ]
    assert codes == [200, 429]  # the change is live on the data path
    assert backend.revert(model, before) == before
    assert httpx.post(f"{gw.url}/v1/completions", json={"model": model}).status_code == 200


def _served(gw: RunningGateway, model: str, n: int) -> Counter[str]:
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        return Counter(
            c.post("/v1/completions", json={"model": model}).json()["replica"] for _ in range(n)
        )


def test_backend_reroutes_a_model_and_reverts_it(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    routing = RoutingSpec(
        (
            ReplicaSpec("hot", replica_servers.add("hot")),
            ReplicaSpec("quiet", replica_servers.add("quiet")),
        )
    )
    gw = start_gateway(routing=routing)
    backend = _backend(gw)
    before = backend.current("victim")
    assert before["weights"] == {"hot": 1, "quiet": 1} and before["weights_set"] is False
    after = backend.apply(Change("reroute", "victim", {"weights": {"hot": 1, "quiet": 3}}))
    assert after["weights"] == {"hot": 1, "quiet": 3} and after["weights_set"] is True
    assert _served(gw, "victim", 8) == {"hot": 2, "quiet": 6}
    assert _served(gw, "other", 4) == {"hot": 2, "quiet": 2}  # only the target moved
    assert backend.revert("victim", before) == before
    assert _served(gw, "victim", 4) == {"hot": 2, "quiet": 2}
    with pytest.raises(BackendError, match=r"422.*no replica named 'gpu7'"):
        backend.apply(Change("reroute", "victim", {"weights": {"gpu7": 1}}))
    with pytest.raises(BackendError, match="'states' are not a gateway lever"):
        backend.apply(
            Change("reroute", "victim", {"weights": {"hot": 1}, "states": {"hot": "drain"}})
        )
    assert backend.current("victim") == before  # refused changes changed nothing


def test_backend_reserves_slots_on_a_replica_and_reverts_it(
    start_gateway: Start, replica_servers: ReplicaServers
) -> None:
    routing = RoutingSpec((ReplicaSpec("gpu0", replica_servers.add("gpu0"), max_in_flight=8),))
    gw = start_gateway(routing=routing)
    backend = _backend(gw)
    before = backend.current("gpu0")
    assert before["reservation"] is None
    after = backend.apply(Change("reserve", "gpu0", {"slots": 3, "priority": 0}))
    assert after["reservation"] == {"slots": 3, "priority": 0}
    assert backend.revert("gpu0", before)["reservation"] is None
    with pytest.raises(BackendError, match="cannot apply a 'max_in_flight' change"):
        backend.apply(Change("max_in_flight", "victim", {"max_in_flight": {"gpu0": 2}}))

"""Contract 3 end to end: the actuator's gateway backend drives a real gateway."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from actuators.backend import Change
from actuators.backends.gateway import GatewayBackend
from actuators.backends.http import HttpCaller
from tests.gateway.conftest import TOKEN, RunningGateway

Start = Callable[..., RunningGateway]


def test_backend_applies_and_reverts_a_limit_and_a_priority(start_gateway: Start) -> None:
    gw = start_gateway()
    model = "meta-llama/Llama-3.1-8B-Instruct"
    backend = GatewayBackend(
        HttpCaller("gateway", gw.control, headers={"Authorization": f"Bearer {TOKEN}"})
    )
    before = backend.current(model)
    assert before == {"rate_rps": None, "burst": None, "priority": None}
    after = backend.apply(Change("rate_limit", model, {"rate_rps": 0.5, "burst": 1}))
    assert after == {"rate_rps": 0.5, "burst": 1, "priority": None}
    backend.apply(Change("priority", model, {"priority": 7}))
    codes = [
        httpx.post(f"{gw.url}/v1/completions", json={"model": model}).status_code for _ in range(2)
    ]
    assert codes == [200, 429]  # the change is live on the data path
    assert backend.revert(model, before) == before
    assert httpx.post(f"{gw.url}/v1/completions", json={"model": model}).status_code == 200

"""The control API (contract 3): auth, validation, state."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.gateway.conftest import TOKEN, RunningGateway, auth, state

Start = Callable[..., RunningGateway]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/control/v1/state", None),
        ("PUT", "/control/v1/limits/llama", {"rate_rps": 1, "burst": 1}),
        ("DELETE", "/control/v1/limits/llama", None),
        ("PUT", "/control/v1/priority/llama", {"priority": 1}),
        ("DELETE", "/control/v1/priority/llama", None),
    ],
)
def test_every_control_call_needs_the_bearer_token(
    start_gateway: Start, method: str, path: str, body: object
) -> None:
    gw = start_gateway()
    url = gw.control + path
    r = httpx.request(method, url, json=body)
    assert r.status_code == 401 and "missing bearer token" in r.json()["error"]
    assert r.headers["www-authenticate"] == "Bearer"
    r = httpx.request(method, url, json=body, headers=auth("wrong"))
    assert r.status_code == 403 and TOKEN not in r.text
    assert "llama" not in state(gw)["models"]  # the refused calls changed nothing
    assert httpx.request(method, url, json=body, headers=auth()).status_code == 200


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"not json", "body: not valid JSON"),
        (b"[1, 2]", "body: must be a JSON object"),
        (b'{"burst": 5}', "field 'rate_rps' is required"),
        (b'{"rate_rps": 5}', "field 'burst' is required"),
        (b'{"rate_rps": "5", "burst": 5}', "field 'rate_rps' must be a number, not str"),
        (b'{"rate_rps": true, "burst": 5}', "field 'rate_rps' must be a number, not bool"),
        (b'{"rate_rps": -1, "burst": 5}', "field 'rate_rps' must be a finite number > 0"),
        (b'{"rate_rps": 0, "burst": 5}', "field 'rate_rps' must be a finite number > 0"),
        (b'{"rate_rps": NaN, "burst": 5}', "NaN is not a valid JSON number"),
        (b'{"rate_rps": Infinity, "burst": 5}', "Infinity is not a valid JSON number"),
        (b'{"rate_rps": 1e999, "burst": 5}', "field 'rate_rps' must be a finite number > 0"),
        # issue 15: a tiny rate was accepted, then 429s carried a ~300-digit Retry-After
        (b'{"rate_rps": 1e-300, "burst": 5}', "field 'rate_rps' must be between 0.001 and"),
        (b'{"rate_rps": 5, "burst": 0}', "field 'burst' must be an integer from 1"),
        (b'{"rate_rps": 5, "burst": 1.5}', "field 'burst' must be an integer, not float"),
        (b'{"rate_rps": 5, "burst": 2, "x": 1}', "field 'x' is not allowed"),
    ],
)
def test_bad_limit_bodies_answer_422_naming_the_field(
    start_gateway: Start, content: bytes, needle: str
) -> None:
    gw = start_gateway()
    r = httpx.put(f"{gw.control}/control/v1/limits/llama", content=content, headers=auth())
    assert r.status_code == 422
    assert needle in r.json()["error"]
    assert "llama" not in state(gw)["models"]  # nothing was half-applied


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"priority": "high"}', "field 'priority' must be an integer, not str"),
        (b'{"priority": 1.5}', "field 'priority' must be an integer, not float"),
        (b'{"priority": 99999999999}', "field 'priority' must fit in 32 bits"),
        (b"{}", "field 'priority' is required"),
    ],
)
def test_bad_priority_bodies_answer_422(start_gateway: Start, content: bytes, needle: str) -> None:
    gw = start_gateway()
    r = httpx.put(f"{gw.control}/control/v1/priority/llama", content=content, headers=auth())
    assert r.status_code == 422 and needle in r.json()["error"]


def test_state_reflects_limits_and_priorities_and_delete_is_idempotent(
    start_gateway: Start,
) -> None:
    gw = start_gateway()
    model = "meta-llama/Llama-3.1-8B-Instruct"  # names with a slash work in the path
    r = httpx.put(
        f"{gw.control}/control/v1/limits/{model}",
        json={"rate_rps": 12.5, "burst": 4.0},
        headers=auth(),
    )
    assert r.status_code == 200
    assert r.json() == {
        "model": model,
        "rate_rps": 12.5,
        "burst": 4,
        "priority": None,
        "in_flight": 0,
        "queued": 0,
        "admitted_total": 0,
        "rejected_total": 0,
    }
    httpx.put(f"{gw.control}/control/v1/priority/{model}", json={"priority": -3}, headers=auth())
    httpx.put(
        f"{gw.control}/control/v1/tenant-priority/batch", json={"priority": 9}, headers=auth()
    )
    st = state(gw)
    assert st["models"][model]["rate_rps"] == 12.5 and st["models"][model]["priority"] == -3
    assert st["tenants"]["batch"]["priority"] == 9
    assert set(st) == {"contract", "models", "tenants", "replicas", "routes", "upstream"}
    assert st["contract"] == 4
    for _ in range(2):
        r = httpx.delete(f"{gw.control}/control/v1/limits/{model}", headers=auth())
        assert r.status_code == 200 and r.json()["rate_rps"] is None and r.json()["burst"] is None
    r = httpx.delete(f"{gw.control}/control/v1/priority/{model}", headers=auth())
    assert r.status_code == 200 and r.json()["priority"] is None
    r = httpx.delete(f"{gw.control}/control/v1/limits/never-limited", headers=auth())
    assert r.status_code == 200 and r.json()["rate_rps"] is None


@pytest.mark.parametrize(("wait_s", "header"), [(0.05, "1"), (2.5, "3"), (1e300, "3600")])
def test_retry_after_is_always_a_small_integer(wait_s: float, header: str) -> None:
    from cotenant.gateway.tickets import Rejected

    assert Rejected(429, "rate_limited", wait_s, "slow down").retry_after_header == header

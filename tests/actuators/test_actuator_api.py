"""``/api/v1/actions`` over real HTTP: the router inside cotenant's API app (its exception
handler maps the errors) under uvicorn, its controller driving the bundled gateway's real
control API, and the whole ``cotenant serve`` wiring."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from act_helpers import (
    GW_TOKEN,
    FakeClock,
    LiveGateway,
    add_incident,
    add_requests,
    live_gateway,
    running,
)
from conftest import start_serve
from prometheus_client import CollectorRegistry

from cotenant.actuators.api import actions_router
from cotenant.actuators.controller import ActionController
from cotenant.actuators.policy import load_policy
from cotenant.actuators.settings import ActuatorSettings
from cotenant.analysis.incidents import IncidentBook
from cotenant.app.api import create_api
from cotenant.store.db import Store
from cotenant.store.source import StoreSource

TOKEN = "tok-5a7c9e1f-never-logged"
NOTHING = {
    "rate_rps": None,
    "burst": None,
    "priority": None,
    "weights": {"nobody": 1},  # the live gateway's one replica, in the default route
    "weights_set": False,
}

Api = tuple[str, ActionController, LiveGateway]


@pytest.fixture(scope="module")
def live() -> Iterator[LiveGateway]:
    with live_gateway() as gw:
        yield gw


@pytest.fixture
def gw(live: LiveGateway) -> LiveGateway:
    """The module's gateway, with no limit or priority left from an earlier test."""
    live.reset()
    return live


@contextlib.contextmanager
def api_on(tmp_path: Path, gw: LiveGateway) -> Iterator[tuple[str, ActionController]]:
    """The actions API (manual mode, one rate-limit and one notify proposal) under uvicorn,
    its controller applying through ``gw``'s control API."""
    store = Store(tmp_path / "a.duckdb")
    add_requests(store, "sdxl", "gpu0", 20, 100, 10, 200)
    add_requests(store, "tts", "gpu0", 20, 130, 20, 40)
    add_incident(store)
    add_incident(
        store,
        id="inc-2",
        model="asr",
        causes=[{"kind": "throttle", "culprit": "gpu0", "share": 0.9, "confidence": 0.9}],
    )
    clock = FakeClock(130)
    reg = CollectorRegistry()
    c = ActionController(
        settings=ActuatorSettings(mode="manual"),
        policy=load_policy(),
        incidents=IncidentBook(store),
        source=StoreSource(store),
        backend=gw.backend(),
        store=store,
        token=TOKEN,
        registry=reg,
        clock_ns=clock,
    )
    c.step(clock())
    app = create_api(store, reg, lambda: None)
    app.include_router(actions_router(c, c))
    try:
        with running(app) as url:
            yield url, c
    finally:
        store.close()


@pytest.fixture
def api(tmp_path: Path, gw: LiveGateway) -> Iterator[Api]:
    with api_on(tmp_path, gw) as (url, c):
        yield url, c, gw


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def rate_action(url: str) -> dict[str, Any]:
    body = httpx.get(f"{url}/api/v1/actions").json()
    return next(a for a in body["actions"] if a["kind"] == "rate_limit")


def test_list_and_filters(api: Api) -> None:
    url, _, _ = api
    r = httpx.get(f"{url}/api/v1/actions")
    assert r.status_code == 200
    body = r.json()
    assert body["mode"] == "manual" and body["count"] == 2
    assert {a["incident_id"] for a in body["actions"]} == {"inc-1", "inc-2"}
    assert all(a["state"] == "proposed" for a in body["actions"])
    only = httpx.get(f"{url}/api/v1/actions", params={"incident": "inc-2"}).json()
    assert [a["kind"] for a in only["actions"]] == ["notify"]
    assert httpx.get(f"{url}/api/v1/actions", params={"limit": 1}).json()["count"] == 1
    assert httpx.get(f"{url}/api/v1/actions", params={"since": "now"}).json()["count"] == 0
    bad = httpx.get(f"{url}/api/v1/actions", params={"limit": 0})
    assert bad.status_code == 400 and "limit" in bad.json()["error"]
    bad = httpx.get(f"{url}/api/v1/actions", params={"since": "yesterday-ish"})
    assert bad.status_code == 400 and "since" in bad.json()["error"]


def test_approve_needs_the_token(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    url, c, gw = api
    caplog.set_level(logging.DEBUG)
    a = rate_action(url)
    r = httpx.post(f"{url}/api/v1/actions/{a['id']}/approve")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = httpx.post(f"{url}/api/v1/actions/{a['id']}/approve", headers={"Authorization": "Basic x"})
    assert r.status_code == 401
    r = httpx.post(f"{url}/api/v1/actions/{a['id']}/approve", headers=auth("wrong-token"))
    assert r.status_code == 403 and "wrong-token" not in r.text
    assert gw.changed() == {}
    r = httpx.post(
        f"{url}/api/v1/actions/{a['id']}/approve", headers=auth(), json={"actor": "alice"}
    )
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "applied" and gw.model("sdxl")["rate_rps"] > 0
    assert gw.model("sdxl") == r.json()["after"]
    assert ("alice", "approved") in [(e["actor"], e["event"]) for e in c.log.audit(a["id"])]
    r = httpx.post(f"{url}/api/v1/actions/{a['id']}/approve", headers=auth())
    assert r.status_code == 409 and "applied" in r.json()["error"]
    r = httpx.post(f"{url}/api/v1/actions/act-nope/approve", headers=auth())
    assert r.status_code == 404
    # rollback with a reason, then again (nothing left to roll back)
    r = httpx.post(
        f"{url}/api/v1/actions/{a['id']}/rollback", headers=auth(), json={"reason": "not now"}
    )
    assert r.status_code == 200 and r.json()["state"] == "rolled_back"
    assert "not now" in r.json()["reason"] and gw.model("sdxl") == NOTHING
    r = httpx.post(f"{url}/api/v1/actions/{a['id']}/rollback", headers=auth())
    assert r.status_code == 409
    r = httpx.post(f"{url}/api/v1/actions/{a['id']}/rollback", headers=auth(), json={"reason": 5})
    assert r.status_code == 422
    assert TOKEN not in caplog.text and "wrong-token" not in caplog.text
    assert "applied" in caplog.text  # the steps themselves are logged


def test_rollback_of_a_down_backend_is_502(tmp_path: Path) -> None:
    # its own gateway: this test stops it
    with live_gateway() as own, api_on(tmp_path, own) as (url, _):
        a = rate_action(url)
        r = httpx.post(f"{url}/api/v1/actions/{a['id']}/approve", headers=auth())
        assert r.status_code == 200 and own.model("sdxl")["rate_rps"] > 0
        own.stop()  # the gateway goes down with the limit in place
        r = httpx.post(f"{url}/api/v1/actions/{a['id']}/rollback", headers=auth())
        assert r.status_code == 502, r.text
        assert "cannot connect" in r.json()["error"] and own.control in r.json()["error"]
        assert rate_action(url)["state"] == "applied"


def test_serve_wires_the_actions_api_and_metrics(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    s = start_serve(
        tmp_path,
        tmp_path / "store.duckdb",
        {
            "COTENANT_ACTUATORS_MODE": "manual",
            "COTENANT_ACTUATORS_TOKEN_FILE": str(token_file),
            "COTENANT_ACTUATORS_BACKEND": "webhook",
            "COTENANT_ACTUATORS_BACKEND_URL": "http://127.0.0.1:9/hook",
            "COTENANT_ACTUATORS_WEBHOOK_SECRET": "k",
            "COTENANT_NVML_ENABLED": "false",
            "COTENANT_LOG_LEVEL": "debug",
        },
    )
    try:
        r = httpx.get(f"{s.api}/api/v1/actions")
        assert r.status_code == 200 and r.json() == {"mode": "manual", "count": 0, "actions": []}
        assert httpx.post(f"{s.api}/api/v1/actions/x/approve").status_code == 401
        assert (
            httpx.post(f"{s.api}/api/v1/actions/x/approve", headers=auth("no")).status_code == 403
        )
        r = httpx.post(f"{s.api}/api/v1/actions/x/rollback", headers=auth())
        assert r.status_code == 404
        metrics = httpx.get(f"{s.api}/metrics").text
        assert "# TYPE cotenant_action_transitions_total counter" in metrics
        assert "# TYPE cotenant_actions_active gauge" in metrics
    finally:
        assert s.stop() == 0
    assert TOKEN not in s.log.read_text()


def test_serve_refuses_a_bad_policy(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("version: 1\ncauses: {cotenant: {action: rate_limit, share_gain: 7}}\n")
    with pytest.raises(RuntimeError) as e:
        start_serve(
            tmp_path,
            tmp_path / "store.duckdb",
            {
                "COTENANT_ACTUATORS_POLICY": str(bad),
                "COTENANT_NVML_ENABLED": "false",
            },
        )
    assert "causes.cotenant.share_gain" in str(e.value) and str(bad) in str(e.value)


def test_serve_in_auto_mode_limits_the_culprit_through_the_gateway(
    tmp_path: Path, gw: LiveGateway
) -> None:
    """The whole path in a running ``cotenant serve``: an open incident in its store, the
    control loop's thread proposes and applies a rate limit on the bundled gateway over real
    HTTP, and a person rolls it back through the API."""
    store_path = tmp_path / "store.duckdb"
    base = time.time_ns() - 200 * 1_000_000_000
    store = Store(store_path)
    add_requests(store, "sdxl", "gpu0", 20, 100, 10, 200, base=base)
    add_requests(store, "tts", "gpu0", 20, 150, 20, 40, base=base)
    add_incident(store, start_s=100, end_s=190, base=base)
    store.close()
    s = start_serve(
        tmp_path,
        store_path,
        {
            "COTENANT_ACTUATORS_MODE": "auto",
            "COTENANT_ACTUATORS_TOKEN": TOKEN,
            "COTENANT_ACTUATORS_BACKEND": "gateway",
            "COTENANT_ACTUATORS_BACKEND_URL": gw.control,
            "COTENANT_GATEWAY_TOKEN": GW_TOKEN,
            "COTENANT_ACTUATORS_INTERVAL_S": "0.2",
            "COTENANT_ANALYSIS_ENABLED": "false",
            "COTENANT_NVML_ENABLED": "false",
        },
    )
    try:
        deadline = time.monotonic() + 30
        acts: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            acts = httpx.get(f"{s.api}/api/v1/actions").json()["actions"]
            if acts and acts[0]["state"] == "applied":
                break
            time.sleep(0.1)
        [a] = acts
        assert a["state"] == "applied" and a["backend"] == "gateway", a
        sdxl = gw.model("sdxl")
        assert sdxl["rate_rps"] == a["params"]["rate_rps"] == pytest.approx(6.0, rel=0.05)
        assert sdxl["burst"] == a["params"]["burst"] and sdxl == a["after"]
        metrics = httpx.get(f"{s.api}/metrics").text
        assert 'cotenant_actions_active{target="sdxl"} 1.0' in metrics
        assert (
            "cotenant_action_transitions_total"
            '{kind="rate_limit",state="applied",target="sdxl"} 1.0' in metrics
        )
        r = httpx.post(
            f"{s.api}/api/v1/actions/{a['id']}/rollback",
            headers=auth(),
            json={"reason": "e2e", "actor": "carol"},
        )
        assert r.status_code == 200 and r.json()["state"] == "rolled_back"
        assert gw.model("sdxl") == NOTHING
    finally:
        assert s.stop() == 0
    log = s.log.read_text()
    assert TOKEN not in log and GW_TOKEN not in log


def test_one_action_with_its_audit_trail(api: Api) -> None:
    url, _, _ = api
    a = rate_action(url)
    httpx.post(f"{url}/api/v1/actions/{a['id']}/approve", headers=auth(), json={"actor": "dee"})
    r = httpx.get(f"{url}/api/v1/actions/{a['id']}")
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == a["id"] and body["state"] == "applied"
    trail = [(e["actor"], e["event"]) for e in body["audit"]]
    assert trail == [("controller", "proposed"), ("dee", "approved"), ("controller", "applied")]
    applied = body["audit"][-1]["detail"]
    assert applied["before"]["rate_rps"] is None and applied["after"]["rate_rps"] > 0
    assert httpx.get(f"{url}/api/v1/actions/act-nope").status_code == 404

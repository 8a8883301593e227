"""The HTTP backends against stand-in servers (real uvicorn on loopback) that check the exact
request shapes of the gateway control API (contract 3), Ray Serve's REST API, Triton's model
repository API and the signed webhook; and what a down or slow backend does."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import hmac
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from act_control_standin import TOKEN, gateway_standin
from act_helpers import FakeClock, add_incident, add_requests, free_socket, running
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cotenant.actuators.backend import Change
from cotenant.actuators.backends.gateway import GatewayBackend
from cotenant.actuators.backends.http import CircuitBreaker, HttpCaller
from cotenant.actuators.backends.rayserve import RayServeBackend
from cotenant.actuators.backends.triton import TritonBackend
from cotenant.actuators.backends.webhook import SIGNATURE_HEADER, WebhookBackend, sign
from cotenant.actuators.controller import ActionController
from cotenant.actuators.policy import load_policy
from cotenant.actuators.settings import ActuatorSettings
from cotenant.analysis.incidents import IncidentBook
from cotenant.core.errors import BackendError
from cotenant.store.db import Store
from cotenant.store.source import StoreSource

# -- stand-ins -----------------------------------------------------------------------------


def caller(name: str, url: str, **kw: Any) -> HttpCaller:
    kw.setdefault("backoff_s", 0.01)
    return HttpCaller(name, url, **kw)


# -- gateway -------------------------------------------------------------------------------


def test_gateway_apply_current_revert_exact_requests() -> None:
    models: dict[str, dict[str, Any]] = {}
    with running(gateway_standin(models)) as url:
        gw = GatewayBackend(caller("gateway", url, headers={"Authorization": f"Bearer {TOKEN}"}))
        before = gw.current("sdxl")
        assert before == {"rate_rps": None, "burst": None, "priority": None}
        after = gw.apply(
            Change("rate_limit", "sdxl", {"rate_rps": 6.0, "burst": 6, "fraction": 0.2})
        )
        assert after == {"rate_rps": 6.0, "burst": 6, "priority": None}
        gw.apply(Change("priority", "sdxl", {"priority": 10}))
        assert models["sdxl"]["priority"] == 10
        assert gw.revert("sdxl", before) == before
        assert models["sdxl"]["rate_rps"] is None and models["sdxl"]["priority"] is None
        # a model that had a limit gets it back, not a DELETE
        models["tts"] = {**models["sdxl"], "rate_rps": 50.0, "burst": 10}
        prev = gw.current("tts")
        gw.apply(Change("rate_limit", "tts", {"rate_rps": 5.0, "burst": 5}))
        gw.revert("tts", prev)
        assert (models["tts"]["rate_rps"], models["tts"]["burst"]) == (50.0, 10)


def test_gateway_auth_errors_are_refusals_not_retried() -> None:
    with running(gateway_standin({})) as url:
        for headers, status in (({}, "401"), ({"Authorization": "Bearer wrong"}, "403")):
            http = caller("gateway", url, headers=headers)
            with pytest.raises(BackendError) as e:
                GatewayBackend(http).current("sdxl")
            assert status in str(e.value) and url in str(e.value)
            assert "wrong" not in str(e.value).replace("wrong token", "")  # token not echoed
            assert http.attempts == 1


# -- down or slow --------------------------------------------------------------------------


def test_down_backend_bounded_retries_then_breaker_opens() -> None:
    sock = free_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()  # nothing listens there now
    slept: list[float] = []
    http = caller(
        "gateway",
        url,
        retries=2,
        backoff_s=0.1,
        sleep=slept.append,
        breaker=CircuitBreaker(failures=2, reset_s=60),
    )
    gw = GatewayBackend(http)
    with pytest.raises(BackendError) as e:
        gw.current("sdxl")
    assert "gateway backend GET" in str(e.value) and url in str(e.value)
    assert "cannot connect" in str(e.value) and "3 tries" in str(e.value)
    assert http.attempts == 3 and slept == [0.1, 0.2]  # exponential backoff
    with pytest.raises(BackendError):
        gw.current("sdxl")
    assert http.breaker.state == "open"
    with pytest.raises(BackendError, match="circuit open"):
        gw.current("sdxl")
    assert http.attempts == 6  # the open breaker made no call


def test_breaker_half_opens_and_closes_on_success() -> None:
    t = [0.0]
    b = CircuitBreaker(failures=1, reset_s=10, clock=lambda: t[0])
    b.failure()
    assert b.state == "open" and not b.allow()
    t[0] = 11.0
    assert b.state == "half-open" and b.allow()
    b.success()
    assert b.state == "closed"


def test_slow_backend_times_out() -> None:
    async def slow(_: Request) -> Response:
        await asyncio.sleep(1.0)
        return JSONResponse({"models": {}})

    app = Starlette(routes=[Route("/control/v1/state", slow)])
    with running(app) as url:
        http = caller("gateway", url, timeout_s=0.2, retries=1)
        with pytest.raises(BackendError, match="timed out") as e:
            GatewayBackend(http).current("sdxl")
        assert http.attempts == 2 and url in str(e.value)


def test_server_errors_are_retried_then_succeed() -> None:
    calls = {"n": 0}

    async def flaky(_: Request) -> Response:
        calls["n"] += 1
        if calls["n"] < 3:
            return JSONResponse({"error": "busy"}, 503)
        return JSONResponse({"models": {"sdxl": {"rate_rps": 2.0, "burst": 2, "priority": 1}}})

    with running(Starlette(routes=[Route("/control/v1/state", flaky)])) as url:
        http = caller("gateway", url, retries=3)
        assert GatewayBackend(http).current("sdxl")["rate_rps"] == 2.0
        assert http.attempts == 3


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "a.duckdb")
    add_requests(s, "sdxl", "gpu0", 20, 100, 10, 200)
    add_requests(s, "tts", "gpu0", 20, 100, 20, 40)
    add_requests(s, "tts", "gpu0", 100, 130, 20, 300)
    add_incident(s)
    yield s
    s.close()


def test_a_down_gateway_fails_the_action_visibly(store: Store) -> None:
    sock = free_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    clock = FakeClock(130)
    c = ActionController(
        settings=ActuatorSettings(mode="auto"),
        policy=load_policy(),
        incidents=IncidentBook(store),
        source=StoreSource(store),
        store=store,
        clock_ns=clock,
        backend=GatewayBackend(caller("gateway", url, retries=1, sleep=lambda _: None)),
    )
    c.step(clock())
    [a] = c.list_actions()
    assert a["state"] == "failed" and url in a["reason"] and "cannot connect" in a["reason"]
    assert a["before"] is None and a["after"] is None


def test_the_controller_applies_the_policys_limit_through_the_control_api(store: Store) -> None:
    models: dict[str, dict[str, Any]] = {}
    clock = FakeClock(130)
    with running(gateway_standin(models)) as url:
        http = caller("gateway", url, headers={"Authorization": f"Bearer {TOKEN}"})
        c = ActionController(
            settings=ActuatorSettings(mode="auto", min_rate_rps=0.0),
            policy=load_policy(),
            incidents=IncidentBook(store),
            source=StoreSource(store),
            store=store,
            clock_ns=clock,
            backend=GatewayBackend(http),
        )
        c.step(clock())
        [a] = c.list_actions()
        assert a["state"] == "applied" and models["sdxl"]["rate_rps"] == a["params"]["rate_rps"]
        assert a["after"]["burst"] == a["params"]["burst"]


# -- Ray Serve -----------------------------------------------------------------------------

RAY_STATE: dict[str, Any] = {
    "controller_info": {"node_id": "n1"},
    "proxy_location": "EveryNode",
    "http_options": {"host": "0.0.0.0", "port": 8000},
    "grpc_options": {"port": 9000, "grpc_servicer_functions": []},
    "target_capacity": None,
    "deploy_mode": "MULTI_APP",
    "applications": {
        "images": {
            "name": "images",
            "route_prefix": "/img",
            "status": "RUNNING",
            "deployed_app_config": {
                "name": "images",
                "route_prefix": "/img",
                "import_path": "img:app",
                "runtime_env": {"pip": ["diffusers"]},
                "deployments": [
                    {
                        "name": "sdxl",
                        "num_replicas": 2,
                        "max_ongoing_requests": 8,
                        "ray_actor_options": {"num_gpus": 0.5},
                    },
                    {"name": "Router", "num_replicas": 1},
                ],
            },
            "deployments": {
                "sdxl": {
                    "name": "sdxl",
                    "status": "HEALTHY",
                    "deployment_config": {
                        "name": "sdxl",
                        "num_replicas": 2,
                        "max_ongoing_requests": 8,
                    },
                },
                "Router": {
                    "name": "Router",
                    "status": "HEALTHY",
                    "deployment_config": {
                        "name": "Router",
                        "num_replicas": 1,
                        "max_ongoing_requests": 5,
                    },
                },
            },
        },
        "speech": {
            "name": "speech",
            "route_prefix": "/tts",
            "status": "RUNNING",
            "deployed_app_config": {
                "name": "speech",
                "route_prefix": "/tts",
                "import_path": "tts:app",
            },
            "deployments": {
                "tts": {
                    "name": "tts",
                    "deployment_config": {
                        "name": "tts",
                        "num_replicas": 1,
                        "max_ongoing_requests": 5,
                    },
                }
            },
        },
    },
}


def ray_standin(puts: list[dict[str, Any]]) -> Starlette:
    state = copy.deepcopy(RAY_STATE)

    async def apps(req: Request) -> Response:
        if req.method == "GET":
            return JSONResponse(state)
        body = await req.json()
        # the shape Ray's ServeDeploySchema takes: a list of applications, each complete
        if not isinstance(body.get("applications"), list):
            return JSONResponse({"error": "applications must be a list"}, 400)
        for a in body["applications"]:
            if not {"name", "route_prefix", "import_path"} <= set(a):
                return JSONResponse({"error": f"incomplete application {a}"}, 400)
        puts.append(body)
        for a in body["applications"]:
            live = state["applications"][a["name"]]
            live["deployed_app_config"] = a
            for d in a.get("deployments", []):
                dc = live["deployments"][d["name"]]["deployment_config"]
                for k in ("num_replicas", "max_ongoing_requests"):
                    dc[k] = d.get(k, 5 if k == "max_ongoing_requests" else 1)
        return JSONResponse({})

    return Starlette(routes=[Route("/api/serve/applications/", apps, methods=["GET", "PUT"])])


def test_rayserve_put_keeps_the_config_and_changes_only_the_culprit() -> None:
    puts: list[dict[str, Any]] = []
    with running(ray_standin(puts)) as url:
        ray = RayServeBackend(caller("rayserve", url))
        before = ray.current("sdxl")
        assert before["max_ongoing_requests"] == 8 and before["app"] == "images"
        after = ray.apply(
            Change("rate_limit", "sdxl", {"rate_rps": 2.0, "burst": 2, "fraction": 0.25})
        )
        assert after["max_ongoing_requests"] == 2
        [body] = puts
        expected = copy.deepcopy(RAY_STATE)
        assert body["proxy_location"] == "EveryNode"
        assert body["http_options"] == expected["http_options"]
        assert body["grpc_options"] == expected["grpc_options"]
        assert "target_capacity" not in body  # null is not sent
        apps = {a["name"]: a for a in body["applications"]}
        assert apps["speech"] == expected["applications"]["speech"]["deployed_app_config"]
        img = expected["applications"]["images"]["deployed_app_config"]
        assert {k: v for k, v in apps["images"].items() if k != "deployments"} == {
            k: v for k, v in img.items() if k != "deployments"
        }
        deps = {d["name"]: d for d in apps["images"]["deployments"]}
        assert deps["Router"] == {"name": "Router", "num_replicas": 1}
        assert deps["sdxl"] == {
            "name": "sdxl",
            "num_replicas": 2,
            "max_ongoing_requests": 2,
            "ray_actor_options": {"num_gpus": 0.5},
        }
        restored = ray.revert("sdxl", before)
        assert restored["max_ongoing_requests"] == 8
        assert {d["name"]: d for d in puts[1]["applications"][0]["deployments"]}["sdxl"] == (
            img["deployments"][0]
        )
        # a deployment not declared in the config gets an entry with only the new knob
        ray.apply(Change("rate_limit", "speech/tts", {"max_ongoing_requests": 1}))
        speech = next(a for a in puts[2]["applications"] if a["name"] == "speech")
        assert speech["deployments"] == [{"name": "tts", "max_ongoing_requests": 1}]
        with pytest.raises(BackendError, match="no request priorities"):
            ray.apply(Change("priority", "sdxl", {"priority": 5}))
        with pytest.raises(BackendError, match="no deployment named"):
            ray.current("nope")


# -- Triton --------------------------------------------------------------------------------

TRITON_CONFIG = {
    "name": "sdxl",
    "platform": "onnxruntime_onnx",
    "max_batch_size": 8,
    "dynamic_batching": {
        "preferred_batch_size": [4, 8],
        "max_queue_delay_microseconds": "100",
        "priority_levels": "0",
        "default_priority_level": "0",
    },
    "instance_group": [{"name": "sdxl_0", "kind": "KIND_GPU", "count": 4, "gpus": [0]}],
}


def triton_standin(loads: list[dict[str, Any]]) -> Starlette:
    configs = {"sdxl": copy.deepcopy(TRITON_CONFIG)}

    async def config(req: Request) -> Response:
        m = req.path_params["model"]
        if m not in configs:
            return JSONResponse({"error": f"Request for unknown model: '{m}' is not found"}, 400)
        return JSONResponse(configs[m])

    async def load(req: Request) -> Response:
        body = await req.json()
        cfg_text = body.get("parameters", {}).get("config")
        if not isinstance(cfg_text, str):
            return JSONResponse({"error": "parameters.config must be a JSON string"}, 400)
        loads.append(body)
        configs[req.path_params["model"]] = json.loads(cfg_text)
        return Response(status_code=200)

    return Starlette(
        routes=[
            Route("/v2/models/{model}/config", config, methods=["GET"]),
            Route("/v2/repository/models/{model}/load", load, methods=["POST"]),
        ]
    )


def test_triton_loads_a_modified_config_and_restores_it() -> None:
    loads: list[dict[str, Any]] = []
    with running(triton_standin(loads)) as url:
        tr = TritonBackend(caller("triton", url))
        before = tr.current("sdxl")
        assert before["instance_count"] == 4 and before["priority_levels"] == 0
        after = tr.apply(Change("priority", "sdxl", {"priority": 3}))
        assert (after["priority_levels"], after["default_priority_level"]) == (3, 3)
        [body] = loads
        assert set(body) == {"parameters"} and set(body["parameters"]) == {"config"}
        sent = json.loads(body["parameters"]["config"])
        assert sent["dynamic_batching"]["preferred_batch_size"] == [4, 8]  # kept as read
        assert sent["instance_group"] == TRITON_CONFIG["instance_group"]
        after = tr.apply(Change("rate_limit", "sdxl", {"rate_rps": 1, "burst": 1, "fraction": 0.5}))
        assert after["instance_count"] == 2
        assert json.loads(loads[1]["parameters"]["config"])["instance_group"][0]["gpus"] == [0]
        tr.revert("sdxl", before)
        assert json.loads(loads[2]["parameters"]["config"]) == TRITON_CONFIG
        with pytest.raises(BackendError, match="400"):
            tr.current("missing")


def test_triton_refuses_priority_without_dynamic_batching() -> None:
    loads: list[dict[str, Any]] = []
    app = triton_standin(loads)
    with running(app) as url:
        tr = TritonBackend(caller("triton", url))
        httpx.get(f"{url}/v2/models/sdxl/config")  # reachable
        cfg = {k: v for k, v in TRITON_CONFIG.items() if k != "dynamic_batching"}
        httpx.post(
            f"{url}/v2/repository/models/sdxl/load",
            json={"parameters": {"config": json.dumps(cfg)}},
        )
        loads.clear()
        with pytest.raises(BackendError, match="no dynamic_batching"):
            tr.apply(Change("priority", "sdxl", {"priority": 2}))
        assert loads == []  # nothing half-applied


# -- webhook -------------------------------------------------------------------------------


def test_webhook_posts_signed_json() -> None:
    got: list[tuple[bytes, str]] = []

    async def hook(req: Request) -> Response:
        body = await req.body()
        sig = req.headers.get(SIGNATURE_HEADER, "")
        want = "sha256=" + hmac.new(b"k3y", body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(sig, want):
            return JSONResponse({"error": "bad signature"}, 401)
        got.append((body, req.headers["content-type"]))
        return JSONResponse({"ok": True})

    with running(Starlette(routes=[Route("/hook", hook, methods=["POST"])])) as url:
        wh = WebhookBackend(caller("webhook", f"{url}/hook"), "k3y", clock_ns=lambda: 42)
        assert wh.current("sdxl") == {}
        wh.apply(Change("rate_limit", "sdxl", {"rate_rps": 3.0, "burst": 3}))
        assert wh.current("sdxl") == {"rate_rps": 3.0, "burst": 3}
        wh.revert("sdxl", {})
        wh.notify({"event": "notify", "action": {"id": "a1"}})
        assert [json.loads(b)["event"] for b, _ in got] == ["apply", "revert", "notify"]
        first = json.loads(got[0][0])
        assert first == {
            "event": "apply",
            "target": "sdxl",
            "sent_ns": 42,
            "change": {
                "kind": "rate_limit",
                "target": "sdxl",
                "params": {"rate_rps": 3.0, "burst": 3},
            },
        }
        assert got[0][1] == "application/json"
        bad = WebhookBackend(caller("webhook", f"{url}/hook"), "wrong")
        with pytest.raises(BackendError, match="401"):
            bad.apply(Change("priority", "sdxl", {"priority": 1}))
    assert sign("k", b"x") == "sha256=" + hmac.new(b"k", b"x", hashlib.sha256).hexdigest()


# -- factory -------------------------------------------------------------------------------


def _cfg(**env: str) -> Any:
    from cotenant.app.config import load_config

    return load_config(env={f"COTENANT_ACTUATORS_{k.upper()}": v for k, v in env.items()}).actuators


def test_make_backend_from_config(tmp_path: Path) -> None:
    from cotenant.actuators.backends.factory import make_backend

    tok = tmp_path / "gw.token"
    tok.write_text("from-file\n")
    models: dict[str, dict[str, Any]] = {"sdxl": {"rate_rps": 1.0, "burst": 1, "priority": 2}}
    with running(gateway_standin(models)) as url:
        gw = make_backend(_cfg(backend_url=url), env={"COTENANT_GATEWAY_TOKEN": TOKEN})
        assert isinstance(gw, GatewayBackend) and gw.current("sdxl")["priority"] == 2
        gw = make_backend(_cfg(backend_url=url, backend_token_file=str(tok)), env={})
        with pytest.raises(BackendError, match="403"):
            gw.current("sdxl")  # the file's token wins, and it is wrong here
    assert isinstance(
        make_backend(_cfg(backend="rayserve", backend_url="http://h:8265")), RayServeBackend
    )
    assert isinstance(
        make_backend(_cfg(backend="triton", backend_url="http://h:8000")), TritonBackend
    )
    assert isinstance(
        make_backend(_cfg(backend="webhook", backend_url="http://h/x", webhook_secret="k")),
        WebhookBackend,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"backend": "gateway"}, "actuators.backend_url"),
        ({"backend": "webhook", "backend_url": "http://h/x"}, "actuators.webhook_secret"),
        ({"backend": "gateway", "backend_url": "ftp://h"}, "must start with http"),
        ({"backend": "simulator"}, "actuators.backend.*simulator"),
        (
            {"backend_url": "http://h", "backend_token_file": "/nonexistent/t"},
            "actuators.backend_token_file",
        ),
    ],
)
def test_make_backend_config_errors(env: dict[str, str], message: str) -> None:
    from cotenant.actuators.backends.factory import make_backend
    from cotenant.core.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        make_backend(_cfg(**env), env={})


def test_build_controller_per_mode(tmp_path: Path) -> None:
    from cotenant.actuators.build import UnconfiguredBackend, build_controller
    from cotenant.core.errors import ConfigError

    store = Store(tmp_path / "b.duckdb")
    try:
        kw: dict[str, Any] = dict(
            store=store, incidents=IncidentBook(store), source=StoreSource(store), registry=None
        )
        assert build_controller(_cfg(mode="off"), **kw) is None
        c = build_controller(_cfg(), **kw)  # dry-run needs no backend URL
        assert c is not None and c.mode == "dry-run"
        assert isinstance(c.backend, UnconfiguredBackend)
        with pytest.raises(ConfigError, match="backend_url"):
            build_controller(_cfg(mode="manual"), **kw)
        with pytest.raises(ConfigError, match="token_file"):
            build_controller(_cfg(token_file=str(tmp_path / "missing")), **kw)
    finally:
        store.close()


def test_gateway_backend_drives_the_real_gateway_control_api() -> None:
    """The client against the bundled gateway's own control app (not the stand-in)."""
    from prometheus_client import CollectorRegistry

    from cotenant.gateway.admission import Admission
    from cotenant.gateway.control import create_control_app
    from cotenant.gateway.routing import Router
    from cotenant.gateway.routing_config import ReplicaSpec, RoutingSpec

    router = Router(RoutingSpec((ReplicaSpec("u", "http://127.0.0.1:9"),)))
    admission = Admission(router=router, max_concurrency=4, max_queue=16, queue_timeout_s=1.0)
    app = create_control_app(admission, TOKEN, CollectorRegistry())
    with running(app) as url:
        gw = GatewayBackend(caller("gateway", url, headers={"Authorization": f"Bearer {TOKEN}"}))
        before = gw.current("meta-llama/Llama-3.1-8B")
        after = gw.apply(
            Change("rate_limit", "meta-llama/Llama-3.1-8B", {"rate_rps": 2.5, "burst": 3})
        )
        assert (after["rate_rps"], after["burst"]) == (2.5, 3)
        after = gw.apply(Change("priority", "meta-llama/Llama-3.1-8B", {"priority": 7}))
        assert after["priority"] == 7
        restored = gw.revert("meta-llama/Llama-3.1-8B", before)
        assert (restored["rate_rps"], restored["burst"]) == (before["rate_rps"], before["burst"])
        assert restored["priority"] == before["priority"]
        with pytest.raises(BackendError, match="422"):
            gw.apply(Change("rate_limit", "m", {"rate_rps": 0.0, "burst": 1}))
        bad = GatewayBackend(caller("gateway", url, headers={"Authorization": "Bearer nope"}))
        with pytest.raises(BackendError, match="403"):
            bad.current("m")

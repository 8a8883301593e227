"""The Ray Serve and Triton backends against the real engines' recorded control-API answers
(tests/fixtures/engines/*/rest*.jsonl, repository.jsonl; recorded by ``make engines``, see
PROVENANCE.md): each request the backend sends must be the one the real engine accepted, in
the same order, and the backend must read the real answers right."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from act_helpers import running
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cotenant.actuators.backend import Change
from cotenant.actuators.backends.factory import make_backend, ray_token
from cotenant.actuators.backends.http import HttpCaller
from cotenant.actuators.backends.rayserve import RayServeBackend
from cotenant.actuators.backends.triton import TritonBackend
from cotenant.actuators.settings import ActuatorSettings
from cotenant.core.errors import BackendError, ConfigError

ENGINES = Path(__file__).resolve().parent.parent / "fixtures" / "engines"


def recorded(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


class Replay:
    """Answers each request with the next recorded exchange, after checking that the request
    is the recorded one (method, path, and the same JSON body)."""

    def __init__(self, exchanges: list[dict[str, Any]]) -> None:
        self.left = list(exchanges)
        self.headers: list[httpx.Headers] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert self.left, f"unexpected {request.method} {request.url.path}"
        e = self.left.pop(0)
        assert (request.method, request.url.path) == (e["method"], e["path"])
        if e["request"] is not None:
            assert json.loads(request.content) == json.loads(e["request"])
        self.headers.append(request.headers)
        ctype = {"content-type": e["content_type"]} if e["content_type"] else {}
        return httpx.Response(e["status"], content=e["response"].encode(), headers=ctype)


def http(name: str, replay: Replay, **kw: Any) -> HttpCaller:
    return HttpCaller(name, "http://engine", transport=httpx.MockTransport(replay), **kw)


# -- Ray Serve 2.60 --------------------------------------------------------------------------

RAY = ENGINES / "rayserve-2.60.0"


def test_rayserve_sends_what_ray_accepted_and_waits_until_ray_shows_it() -> None:
    ex = recorded(RAY / "rest.jsonl")
    gets = [e for e in ex if e["method"] == "GET"]
    puts = [e for e in ex if e["method"] == "PUT"]
    # Ray applies a PUT asynchronously: replay the answer it gave before the change once more
    # after the PUT (what a GET right after a PUT showed in an earlier run), then its own
    stale = gets[0]
    replay = Replay([gets[0], gets[1], puts[0], stale, gets[2], gets[3], puts[1], gets[4]])
    slept: list[float] = []
    ray = RayServeBackend(http("rayserve", replay), sleep=slept.append)
    before = ray.current("slow/Sleeper")
    assert (before["max_ongoing_requests"], before["declared"]) == (8, None)
    after = ray.apply(Change("rate_limit", "Sleeper", {"max_ongoing_requests": 1}))
    assert after["max_ongoing_requests"] == 1
    assert slept == [0.25]  # one poll past the stale answer
    restored = ray.revert("Sleeper", before)
    assert restored["max_ongoing_requests"] == 8
    assert replay.left == []


def test_rayserve_gives_up_waiting_and_shows_what_ray_shows() -> None:
    ex = recorded(RAY / "rest.jsonl")
    gets = [e for e in ex if e["method"] == "GET"]
    put = next(e for e in ex if e["method"] == "PUT")
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    replay = Replay([gets[1], put] + [gets[0]] * 5)
    ray = RayServeBackend(http("rayserve", replay), settle_s=1.0, sleep=sleep, clock=lambda: now[0])
    after = ray.apply(Change("rate_limit", "Sleeper", {"max_ongoing_requests": 1}))
    assert after["max_ongoing_requests"] == 8  # not applied yet: said as it is


def test_rayserve_without_the_clusters_token_says_which_key_to_set() -> None:
    replay = Replay(recorded(RAY / "rest-401.jsonl"))
    ray = RayServeBackend(http("rayserve", replay))
    with pytest.raises(
        BackendError, match=r"401.*Missing authentication token.*backend_token_file"
    ):
        ray.current("Sleeper")


def test_the_ray_token_is_found_as_rays_own_clients_find_it(tmp_path: Path) -> None:
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("from-home\n")
    (tmp_path / "t").write_text("from-path\n")
    home = {"HOME": str(tmp_path)}
    assert ray_token({}) == ""
    assert ray_token(home) == "from-home"
    assert ray_token({**home, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "t")}) == "from-path"
    assert ray_token({**home, "RAY_AUTH_TOKEN": "from-env"}) == "from-env"
    with pytest.raises(ConfigError, match="RAY_AUTH_TOKEN_PATH"):
        ray_token({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "nope")})


def ray_dashboard(token: str) -> Starlette:
    """Ray's REST route with token authentication on, answering as the real one did: its
    recorded 401 without the token, 403 with a wrong one, its recorded state with it."""
    denied = recorded(RAY / "rest-401.jsonl")[0]
    state = recorded(RAY / "rest.jsonl")[0]

    async def apps(request: Request) -> Response:
        auth = request.headers.get("authorization", "")
        if not auth:
            return Response(denied["response"], denied["status"], media_type="text/plain")
        if auth != f"Bearer {token}":
            return Response("Forbidden: Invalid authentication token", 403)
        return Response(state["response"], 200, media_type="application/json")

    return Starlette(routes=[Route("/api/serve/applications/", apps)])


def test_make_backend_sends_the_ray_token(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("t-config\n")
    with running(ray_dashboard("t-config")) as url:
        cfg = ActuatorSettings(backend="rayserve", backend_url=url)
        with_file = ActuatorSettings(
            backend="rayserve", backend_url=url, backend_token_file=str(tmp_path / "tok")
        )
        ray = make_backend(with_file, env={"RAY_AUTH_TOKEN": "t-env"})  # the config's wins
        assert ray.current("Sleeper")["max_ongoing_requests"] == 8
        with pytest.raises(BackendError, match=r"403.*backend_token_file"):
            make_backend(cfg, env={"RAY_AUTH_TOKEN": "t-env"}).current("Sleeper")
        with pytest.raises(BackendError, match="401"):
            make_backend(cfg, env={}).current("Sleeper")


# -- Triton 2.51 -----------------------------------------------------------------------------


def test_triton_loads_the_configs_triton_accepted_and_restores_the_original() -> None:
    ex = recorded(ENGINES / "triton-2.51.0" / "repository.jsonl")
    replay = Replay(ex)
    tr = TritonBackend(http("triton", replay))
    before = tr.current("sleeper")
    assert (before["instance_count"], before["priority_levels"]) == (2, 0)
    assert tr.apply(Change("rate_limit", "sleeper", {"fraction": 0.5}))["instance_count"] == 1
    after = tr.apply(Change("priority", "sleeper", {"priority": 2}))
    assert (after["priority_levels"], after["default_priority_level"]) == (2, 2)
    restored = tr.revert("sleeper", before)
    assert restored["config"] == before["config"]
    assert replay.left == []

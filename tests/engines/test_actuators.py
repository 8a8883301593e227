"""cotenant's actuator backends against the real engines: the change lands (read back through
the engine's own API), it changes what a client load sees, and the revert restores both.

Figures (the load's peak concurrency / distinct serving processes and wall time before, during
and after each change) go to tests/artifacts/engines/actuators.json for docs/instrumenting.md.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from cotenant.actuators.backend import Change
from cotenant.actuators.backends.factory import make_backend
from cotenant.actuators.backends.http import HttpCaller
from cotenant.actuators.backends.rayserve import RayServeBackend
from cotenant.actuators.backends.triton import TritonBackend
from cotenant.actuators.settings import ActuatorSettings
from cotenant.core.errors import BackendError
from tests.engines.conftest import RayCluster, TritonServer, wait_for
from tests.engines.recording import RECORDINGS, RecordingTransport

CLIENTS = 8
SLEEP_S = 0.3
FIGURES: dict[str, Any] = {}


def _save(name: str, figures: dict[str, Any]) -> None:
    FIGURES[name] = figures
    RECORDINGS.mkdir(parents=True, exist_ok=True)
    (RECORDINGS / "actuators.json").write_text(json.dumps(FIGURES, indent=2) + "\n")


def _load(call: Any) -> tuple[list[Any], float]:
    """``CLIENTS`` concurrent calls of ``call``: their answers and the wall time (s)."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(lambda _: call(), range(CLIENTS)))
    return answers, time.perf_counter() - t0


# --- Ray Serve: max_ongoing_requests through the dashboard's REST API -------------------------


def _ray_load(cluster: RayCluster) -> dict[str, Any]:
    with httpx.Client(timeout=60) as client:

        def one() -> dict[str, Any]:
            r = client.get(f"{cluster.http}/slow", params={"s": SLEEP_S})
            assert r.status_code == 200, r.text
            answer: dict[str, Any] = r.json()
            return answer

        answers, wall = _load(one)
    return {
        "peak_in_flight": max(a["held"] for a in answers),
        "wall_s": round(wall, 3),
        "pids": sorted({a["pid"] for a in answers}),
    }


def _settled(cluster: RayCluster, app: str, dep: str, limit: int) -> dict[str, Any] | None:
    detail = cluster.applications()[app]
    d = detail["deployments"][dep]
    if detail["status"] != "RUNNING" or d["status"] != "HEALTHY":
        return None
    if d["deployment_config"]["max_ongoing_requests"] != limit:
        return None
    running = [r for r in d["replicas"] if r["state"] == "RUNNING"]
    return {"replica_pids": sorted(r["pid"] for r in running)} if running else None


def test_rayserve_backend_caps_a_real_deployment_and_rolls_back(ray_cluster: RayCluster) -> None:
    cfg = ActuatorSettings(
        backend="rayserve",
        backend_url=ray_cluster.dashboard,
        backend_token_file=str(ray_cluster.token_file),
    )
    assert make_backend(cfg).current("Sleeper")["max_ongoing_requests"] == 8  # token accepted
    tokenless = RayServeBackend(
        HttpCaller("rayserve", ray_cluster.dashboard, transport=RecordingTransport("rayserve-401"))
    )
    with pytest.raises(BackendError, match=r"refused with 401.*backend_token_file"):
        tokenless.current("Sleeper")
    http = HttpCaller(
        "rayserve",
        ray_cluster.dashboard,
        timeout_s=30,
        headers=ray_cluster.auth,
        transport=RecordingTransport("rayserve-rest"),
    )
    backend = RayServeBackend(http)
    before = backend.current("slow/Sleeper")
    assert before["max_ongoing_requests"] == 8
    pids = _settled(ray_cluster, "slow", "Sleeper", 8)
    assert pids is not None
    load_before = _ray_load(ray_cluster)

    after = backend.apply(Change("rate_limit", "Sleeper", {"max_ongoing_requests": 1}))
    assert after["max_ongoing_requests"] == 1
    during_pids = wait_for("Sleeper at 1", lambda: _settled(ray_cluster, "slow", "Sleeper", 1))
    load_during = _ray_load(ray_cluster)

    restored = backend.revert("Sleeper", before)
    assert restored["max_ongoing_requests"] == 8
    after_pids = wait_for("Sleeper at 8", lambda: _settled(ray_cluster, "slow", "Sleeper", 8))
    load_after = _ray_load(ray_cluster)
    # the other applications were left as they were
    apps = ray_cluster.applications()
    assert {a: apps[a]["status"] for a in ("mm", "burst")} == {"mm": "RUNNING", "burst": "RUNNING"}

    _save(
        "rayserve",
        {
            "before": {**load_before, **pids},
            "max_ongoing_requests=1": {**load_during, **during_pids},
            "reverted": {**load_after, **after_pids},
        },
    )
    # in place: the same replica process throughout
    assert pids == during_pids == after_pids
    assert load_before["peak_in_flight"] > 1
    assert load_during["peak_in_flight"] == 1
    assert load_during["wall_s"] >= CLIENTS * SLEEP_S * 0.9
    assert load_after["peak_in_flight"] > 1
    assert load_after["wall_s"] < load_during["wall_s"] / 2


# --- Triton: model configuration through the model repository API (explicit mode) ------------


def _triton_load(server: TritonServer) -> dict[str, Any]:
    body = {"inputs": [{"name": "s", "shape": [1, 1], "datatype": "FP32", "data": [SLEEP_S]}]}
    with httpx.Client(timeout=60) as client:

        def one() -> int:
            r = client.post(f"{server.url}/v2/models/sleeper/infer", json=body)
            assert r.status_code == 200, r.text
            return int(r.json()["outputs"][0]["data"][0])

        pids, wall = _load(one)
    return {"serving_pids": len(set(pids)), "wall_s": round(wall, 3)}


def test_triton_backend_reloads_a_real_model_config_and_restores_it(
    triton: TritonServer,
) -> None:
    assert (
        make_backend(ActuatorSettings(backend="triton", backend_url=triton.url)).current("sleeper")[
            "instance_count"
        ]
        == 2
    )
    http = HttpCaller(
        "triton", triton.url, timeout_s=60, transport=RecordingTransport("triton-repository")
    )
    backend = TritonBackend(http)
    before = backend.current("sleeper")
    assert before["instance_count"] == 2
    load_before = _triton_load(triton)

    halved = backend.apply(Change("rate_limit", "sleeper", {"fraction": 0.5}))
    assert halved["instance_count"] == 1
    load_halved = _triton_load(triton)

    prioritised = backend.apply(Change("priority", "sleeper", {"priority": 2}))
    db = prioritised["config"]["dynamic_batching"]
    assert (prioritised["priority_levels"], prioritised["default_priority_level"]) == (2, 2)
    assert db["max_queue_delay_microseconds"] in (100, "100")  # the rest of the config kept
    assert prioritised["instance_count"] == 1

    restored = backend.revert("sleeper", before)
    assert restored["instance_count"] == 2
    assert restored["config"] == before["config"]
    load_after = _triton_load(triton)
    index = httpx.post(f"{triton.url}/v2/repository/index", json={}, timeout=30).json()
    assert {m["name"]: m["state"] for m in index} == dict.fromkeys(
        ("bls_pipeline", "double", "matmul", "pipeline", "sleeper"), "READY"
    )  # the other models were left alone

    _save(
        "triton",
        {
            "before": load_before,
            "instance_group count 2->1": load_halved,
            "priority_levels": prioritised["priority_levels"],
            "reverted": load_after,
        },
    )
    assert load_before["serving_pids"] == 2
    assert load_halved["serving_pids"] == 1
    assert load_halved["wall_s"] >= CLIENTS * SLEEP_S * 0.9
    assert load_after["serving_pids"] == 2
    assert load_after["wall_s"] < load_halved["wall_s"] * 0.75

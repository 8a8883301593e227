"""Fixtures of the reliability suite: a whole ``cotenant serve`` service in this process (on
free loopback ports, a fresh store, NVML off), shared by a module's tests to spare the CPU."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings

from cotenant.app.config import load_config
from cotenant.app.service import Service
from cotenant.store.db import Store

# Property-based fuzzing (hypothesis): a small, fixed budget in `make test` (CI), a large one
# in `make reliability` (COTENANT_FUZZ_EXAMPLES per fuzz test). Derandomized in CI so a run
# is reproducible; no example database is written into the repository.
settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("COTENANT_FUZZ_EXAMPLES", "60")),
    deadline=None,
    database=None,
    derandomize=os.environ.get("COTENANT_FUZZ_RANDOM", "") == "",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("ci")


def service(
    path: Path,
    env: dict[str, str] | None = None,
    store: Store | None = None,
    nvml: Any | None = None,
) -> Service:
    """A service (not started) on a store file at ``path``, or on ``store`` when given;
    ``nvml``: the NVML double to poll (set ``COTENANT_NVML_ENABLED`` too)."""
    cfg = load_config(
        env={
            "COTENANT_SERVER_PORT": "0",
            "COTENANT_OTLP_HTTP_PORT": "0",
            "COTENANT_OTLP_GRPC_PORT": "0",
            "COTENANT_NVML_ENABLED": "false",
            **(env or {}),
        }
    )
    cfg = dataclasses.replace(cfg, store=dataclasses.replace(cfg.store, path=str(path)))
    return Service(cfg, store=store, nvml=nvml)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A running service (dashboard included) with its endpoints resolved."""
    svc = service(tmp_path_factory.mktemp("live") / "store.duckdb")
    t = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
    t.start()
    assert svc.started.wait(60)
    yield svc
    svc.stop()
    t.join(60)


def healthy(svc: Service) -> bool:
    """The service answers its liveness and readiness probes."""
    assert svc.endpoints is not None
    api = svc.endpoints.api
    return (
        httpx.get(f"{api}/healthz", timeout=10).status_code == 200
        and httpx.get(f"{api}/readyz", timeout=10).status_code == 200
    )

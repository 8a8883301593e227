"""Ray Serve applications the engine tests deploy (imported by Ray's workers, not by pytest).

``mm``: ``MatMul``, a numpy (n x 256) @ (256 x 256) product per request, answering its pid.
``slow``: ``Sleeper``, an asyncio sleep of ``s`` seconds per request, answering how many requests
the replica held at once when this one finished sleeping (what ``max_ongoing_requests`` caps).
``burst``: ``Burner``, ``ms`` milliseconds of numpy work per request (the contention test's
noisy neighbour).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
from ray import serve
from starlette.requests import Request


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=5)
class MatMul:
    def __init__(self) -> None:
        self.w = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)

    async def __call__(self, request: Request) -> dict[str, Any]:
        n = int(request.query_params.get("n", "64"))
        y = np.ones((n, 256), dtype=np.float32) @ self.w
        return {"sum": float(y.sum()), "pid": os.getpid()}


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=8)
class Sleeper:
    def __init__(self) -> None:
        self.in_flight = 0

    async def __call__(self, request: Request) -> dict[str, Any]:
        self.in_flight += 1
        try:
            await asyncio.sleep(float(request.query_params.get("s", "0.3")))
            held = self.in_flight
        finally:
            self.in_flight -= 1
        return {"held": held, "pid": os.getpid()}


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=16)
class Burner:
    def __init__(self) -> None:
        self.w = np.random.default_rng(1).standard_normal((512, 512)).astype(np.float32)

    def __call__(self, request: Request) -> dict[str, Any]:
        end = time.perf_counter() + float(request.query_params.get("ms", "50")) / 1e3
        x = np.ones((64, 512), dtype=np.float32)
        while time.perf_counter() < end:
            x = np.tanh(x @ self.w)
        return {"pid": os.getpid()}


mm = MatMul.bind()
slow = Sleeper.bind()
burst = Burner.bind()

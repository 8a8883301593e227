"""The bundled gateway (the code ``cotenant gateway`` runs) on its own event loop in a thread,
for tests of the gateway itself and of the actuators that drive its control API."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from cotenant.gateway.server import Gateway
from cotenant.gateway.settings import GatewaySettings


class RunningGateway:
    """A :class:`Gateway` on its own event loop in a thread; :meth:`stop` once done."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.registry = CollectorRegistry()
        self.gateway = Gateway(settings, registry=self.registry)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.gateway.start(), self.loop).result(20)
        self.url = self.gateway.listen_url
        self.control = self.gateway.control_url
        self.running = True

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the gateway's loop (to read its state safely)."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def stop(self) -> None:
        """Stop the gateway (its ports refuse connections from now on) and its loop."""
        if not self.running:
            return
        self.running = False
        asyncio.run_coroutine_threadsafe(self.gateway.stop(), self.loop).result(20)

        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(drain(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(20)
        self.loop.close()

"""The resilient HTTP caller every HTTP backend uses: timeout, bounded retries with exponential
backoff, and a circuit breaker.

A call is retried (at most ``retries`` times, waiting ``backoff_s x 2^n`` between tries) when
the backend cannot be reached, times out or answers 5xx / 429; a 4xx answer is a refusal and
is not retried. After ``breaker_failures`` failed calls in a row the breaker opens: calls fail
at once for ``breaker_reset_s``, then one trial call is let through (half-open) and closes it
again when it succeeds. Every failure raises :class:`store.errors.BackendError` naming the
backend, the method and URL and what happened. Headers (tokens) never appear in messages.
"""

from __future__ import annotations

import functools
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from cotenant.actuators.settings import ActuatorSettings
from cotenant.core.errors import BackendError


class CircuitBreaker:
    def __init__(
        self, failures: int = 5, reset_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures = failures
        self.reset_s = reset_s
        self._clock = clock
        self._count = 0
        self._opened: float | None = None
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        with self._lock:
            if self._opened is None:
                return "closed"
            return "half-open" if self._clock() - self._opened >= self.reset_s else "open"

    def allow(self) -> bool:
        return self.state != "open"

    def success(self) -> None:
        with self._lock:
            self._count = 0
            self._opened = None

    def failure(self) -> None:
        with self._lock:
            self._count += 1
            if self._count >= self.failures or self._opened is not None:
                self._opened = self._clock()


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default verifying TLS context (certifi's CAs), built once per process."""
    return httpx.create_ssl_context()


class HttpCaller:
    """Calls one backend's HTTP API. Thread-safe."""

    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        timeout_s: float = ActuatorSettings.backend_timeout_s,
        retries: int = ActuatorSettings.backend_retries,
        backoff_s: float = 0.2,
        breaker: CircuitBreaker | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise BackendError(
                f"{name} backend: base URL {base_url!r} must start with http:// or https:// "
                "(set [actuators] backend_url)"
            )
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.breaker = breaker or CircuitBreaker()
        self._sleep = sleep
        self.timeout_s = timeout_s
        self._headers = dict(headers or {})
        self._transport = transport
        self.attempts = 0  # every HTTP attempt made (tests and benchmarks read it)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        ok: tuple[int, ...] = (),
    ) -> httpx.Response:
        """The backend's 2xx answer (or one of ``ok``), or BackendError."""
        url = f"{self.base_url}{path}"
        where = f"{self.name} backend {method} {url}"
        if not self.breaker.allow():
            raise BackendError(
                f"{where}: circuit open after repeated failures; not calling for up to "
                f"{self.breaker.reset_s:g} s (check that the backend is up)"
            )
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            self.attempts += 1
            try:
                # a client per call (nothing is left open between the rare control calls),
                # sharing one TLS context: building that is ~20 ms, ten times the call
                with httpx.Client(
                    timeout=self.timeout_s,
                    headers=self._headers,
                    transport=self._transport,
                    verify=_tls_context(),
                ) as client:
                    r = client.request(method, url, json=json, content=content, headers=headers)
            except httpx.TimeoutException:
                last = f"timed out after {self.timeout_s:g} s"
                continue
            except httpx.TransportError as exc:
                last = f"cannot connect ({type(exc).__name__}: {exc})"
                continue
            if r.is_success or r.status_code in ok:
                self.breaker.success()
                return r
            body = r.text[:300].strip()
            if r.status_code >= 500 or r.status_code == 429:
                last = f"answered {r.status_code}: {body}"
                continue
            self.breaker.success()  # it answered: reachable, it just refused
            raise BackendError(f"{where}: refused with {r.status_code}: {body}")
        self.breaker.failure()
        raise BackendError(
            f"{where}: {last} ({self.retries + 1} tries; breaker {self.breaker.state})"
        )

    def json(self, method: str, path: str, **kw: Any) -> Any:
        r = self.request(method, path, **kw)
        try:
            return r.json()
        except ValueError as exc:
            raise BackendError(
                f"{self.name} backend {method} {self.base_url}{path}: answer is not JSON: "
                f"{r.text[:200]!r}"
            ) from exc

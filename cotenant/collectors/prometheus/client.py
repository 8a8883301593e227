"""``PromQLClient``: PromQL queries against one Prometheus HTTP API, as numpy series.

It runs instant and range queries through ``prometheus-api-client`` (or any
:class:`PromClient`), cuts long ranges into chunks of
:data:`collectors.prometheus.promql.MAX_POINTS`, and lays range answers out as dense per-window
columns on a :class:`collectors.prometheus.promql.Grid`.
:class:`collectors.prometheus.source.PrometheusSource` builds its frames on it; the query texts
are in :mod:`collectors.prometheus.promql`.

**Errors**: every failure (refused, timed out, HTTP error, not JSON, unexpected JSON) raises
:class:`store.errors.SourceError` naming the URL, the query and what to do. Nothing is retried.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any, NoReturn, Protocol

import numpy as np
import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from cotenant.collectors.prometheus import promql
from cotenant.collectors.prometheus.promql import FIELD, MAX_POINTS, Grid
from cotenant.core.errors import SourceError, UsageError
from cotenant.core.timerange import TimeRange

Series = tuple[dict[str, str], np.ndarray, np.ndarray]
"""``(labels, ts_ns int64[n], values float64[n])``."""
Fields = dict[str, np.ndarray]
"""Column -> float64[n windows], NaN where unknown."""


class PromClient(Protocol):
    """What the client needs of ``prometheus_api_client.PrometheusConnect``: the parsed
    ``data.result`` of ``/api/v1/query`` and ``/api/v1/query_range``."""

    def custom_query(self, query: str, params: dict[str, Any]) -> Any: ...

    def custom_query_range(
        self,
        query: str,
        start_time: datetime,
        end_time: datetime,
        step: str,
        params: dict[str, Any],
    ) -> Any: ...


class PromQLClient:
    """Queries against the API root ``url`` (``http://prometheus:9090``).

    ``timeout_s`` (> 0) bounds each HTTP call and each query on the server. ``client``
    replaces the ``PrometheusConnect`` built here (auth, proxies, a test double). Raises
    :class:`UsageError` for an empty URL or a timeout <= 0; every query may raise
    :class:`SourceError`.
    """

    def __init__(self, url: str, timeout_s: float, client: PromClient | None = None) -> None:
        if not url:
            raise UsageError("PromQLClient needs the URL of a Prometheus ([prometheus] url)")
        if not timeout_s > 0:
            raise UsageError(f"timeout_s {timeout_s} must be > 0")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._owned: PrometheusConnect | None = None
        if client is None:
            # No retries: a down server fails within the timeout, not after backoffs; read=False
            # keeps a read timeout a requests.Timeout. The timeout is seconds, float allowed.
            no_retry = Retry(total=0, read=False)
            self._owned = PrometheusConnect(self.url, retry=no_retry, timeout=timeout_s)  # type: ignore[arg-type]
            client = self._owned
        self._client: PromClient = client

    def close(self) -> None:
        """Release the HTTP connections of the client built here (not an injected one)."""
        if self._owned is not None:
            self._owned.close()

    def instant(self, query: str, at_ns: int | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query at ``at_ns`` (default now): one ``(labels, value)`` per series
        (the last sample of each series of a range-vector query)."""
        return [(labels, float(v[-1])) for labels, _, v in self.at(query, at_ns) if v.size]

    def at(self, query: str, at_ns: int | None) -> list[Series]:
        """An instant query at ``at_ns`` (default now), every sample of every series."""
        params = {"timeout": f"{self.timeout_s:g}"}
        if at_ns is not None:
            params["time"] = promql.seconds(at_ns)
        return self._call(query, partial(self._client.custom_query, query, params=params))

    def range(self, query: str, rng: TimeRange, step_s: float) -> list[Series]:
        """``query`` evaluated at the end of each window of ``step_s`` that starts in ``rng``;
        each series' ``ts_ns`` are window starts. Long ranges go in chunks of 10,000 points."""
        return self.on_grid(query, promql.grid(rng, step_s))

    def on_grid(self, query: str, g: Grid) -> list[Series]:
        """``query`` evaluated at the end of each window of ``g``, in chunks of
        ``MAX_POINTS``; each series' ``ts_ns`` are window starts."""
        parts: dict[tuple[tuple[str, str], ...], list[Series]] = defaultdict(list)
        for c in range(0, g.n, MAX_POINTS):
            first = g.w0 + (c + 1) * g.step
            last = g.w0 + min(g.n, c + MAX_POINTS) * g.step
            params = {
                "start": promql.seconds(first),  # exact; the client rounds its own to seconds
                "end": promql.seconds(last),
                "timeout": f"{self.timeout_s:g}",
            }
            t0, t1 = (datetime.fromtimestamp(t / 1e9, UTC) for t in (first, last))
            step = promql.seconds(g.step)
            call = partial(self._client.custom_query_range, query, t0, t1, step, params=params)
            for labels, ts, vals in self._call(query, call):
                parts[tuple(sorted(labels.items()))].append((labels, ts - g.step, vals))
        return [
            (p[0][0], np.concatenate([s[1] for s in p]), np.concatenate([s[2] for s in p]))
            for p in parts.values()
        ]

    def blocks(self, query: str, g: Grid, by: tuple[str, ...]) -> dict[tuple[str, ...], Fields]:
        """A union query's series as dense columns: identity (``by`` labels) -> field (the
        :data:`collectors.prometheus.promql.FIELD` label) -> values per window of ``g``."""
        out: dict[tuple[str, ...], Fields] = {}
        for labels, ts, vals in self.on_grid(query, g):
            fields = out.setdefault(tuple(labels.get(b, "") for b in by), {})
            arr = fields.setdefault(labels.get(FIELD, ""), np.full(g.n, np.nan))
            k, ok = g.index(ts)
            arr[k[ok]] = vals[ok]
        return out

    def _fail(self, query: str, what: str, remedy: str, exc: BaseException) -> NoReturn:
        q = query if len(query) <= 240 else query[:240] + "…"
        raise SourceError(
            f"Prometheus at {self.url} {what} (query: {q}); {remedy}", url=self.url, query=query
        ) from exc

    def _call(self, query: str, fn: Callable[[], Any]) -> list[Series]:
        """Run one HTTP call; translate every failure into SourceError."""
        try:
            return promql.parse_result(fn())
        except requests.Timeout as exc:
            self._fail(
                query,
                f"did not answer within {self.timeout_s:g} s",
                "raise [prometheus] timeout_s, or query a shorter range or a larger step",
                exc,
            )
        except (requests.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as exc:
            self._fail(
                query,
                f"answered something that is not the Prometheus HTTP API ({exc!s:.200})",
                "check that [prometheus] url is the API root (e.g. http://host:9090)",
                exc,
            )
        except PrometheusApiClientException as exc:
            self._fail(
                query,
                f"refused the query: {promql.complaint(str(exc))}",
                "check the query, the URL and the server's limits",
                exc,
            )
        except OSError as exc:  # requests' ConnectionError and the rest of its family
            m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(exc))
            self._fail(
                query,
                f"cannot be reached ({m.group(1) if m else type(exc).__name__})",
                "check that it is running and that [prometheus] url points at it",
                exc,
            )

"""Drill-down from central ``cotenant serve`` into the agent that owns a GPU.

Prometheus holds aggregates; the requests behind them stay on the node's agent.
:class:`AgentDrill` finds which agent published a (model, GPU)'s latency series in a range (their
``node`` and ``instance`` labels, :meth:`collectors.prometheus.source.PrometheusSource.owners`),
builds its URL from ``[prometheus] agent_url_template`` and asks its ``/api/v1/slowest``. Every
failure is an answer, never an exception: the diagnosis made from Prometheus stands whatever becomes
of the drill-down, and the answer says why there are no requests (``node unreachable``, no agent
publishes that model, Prometheus down).
"""

from __future__ import annotations

import string
from typing import Any

import httpx

from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.errors import ConfigError, SourceError
from cotenant.core.timerange import TimeRange

PLACEHOLDERS = frozenset(("node", "instance"))


def check_template(template: str) -> str:
    """``template`` if it names only {node} and {instance}, else ConfigError naming the key."""
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        raise ConfigError(
            f"config key prometheus.agent_url_template: bad value {template!r}: {exc}"
        ) from exc
    bad = names - PLACEHOLDERS
    if bad or not template.startswith(("http://", "https://")):
        raise ConfigError(
            f"config key prometheus.agent_url_template: bad value {template!r}: an http(s) "
            "URL whose only placeholders are {node} and {instance}"
        )
    return template


class AgentDrill:
    """Slowest requests of a (model, GPU) over a range, from the agent that owns it."""

    def __init__(
        self,
        source: PrometheusSource,
        template: str,
        *,
        timeout_s: float = 3.0,
        transport: httpx.BaseTransport | None = None,
        token: str = "",
    ) -> None:
        """``token``: the read token the agents require ([auth] token; the fleet shares one),
        '' when they answer anyone."""
        self._source = source
        self._template = check_template(template)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._client = httpx.Client(timeout=timeout_s, transport=transport, headers=headers)
        self.timeout_s = timeout_s

    def close(self) -> None:
        self._client.close()

    def agent_url(self, node: str, instance: str) -> str:
        return self._template.format(node=node, instance=instance).rstrip("/")

    def slowest(
        self, model: str, gpu: str | None, since_ns: int, until_ns: int, limit: int = 20
    ) -> dict[str, Any]:
        """``{model, gpu, agents: [{node, url, reachable, error, requests}], requests, note}``:
        ``requests`` merges every owning agent's answer, slowest first; ``note`` says why
        some or all are missing (None when every agent answered)."""
        out: dict[str, Any] = {"model": model, "gpu": gpu, "agents": [], "requests": []}
        try:
            owners = self._source.owners(TimeRange(since_ns, until_ns), model, gpu or None)
        except SourceError as exc:
            out["note"] = f"Prometheus is unreachable, so the owning agent is unknown: {exc}"
            return out
        if not owners:
            out["note"] = (
                "no cotenant agent publishes this model's latency (exporter series only): "
                "no request-level detail"
            )
            return out
        notes = []
        for o in owners:
            url = self.agent_url(o["node"], o["instance"])
            agent: dict[str, Any] = {"node": o["node"], "url": url, "reachable": True}
            try:
                r = self._client.get(
                    f"{url}/api/v1/slowest",
                    params={
                        "model": model,
                        "since": f"{since_ns / 1e9:.3f}",
                        "until": f"{until_ns / 1e9:.3f}",
                        "limit": limit,
                        **({"gpu": gpu} if gpu else {}),
                    },
                )
                r.raise_for_status()
                rows = r.json()["requests"]
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                agent.update(reachable=False, error=f"{type(exc).__name__}: {exc}"[:300])
                notes.append(f"node {o['node'] or o['instance']} unreachable ({url})")
                out["agents"].append(agent)
                continue
            agent["requests"] = len(rows)
            out["agents"].append(agent)
            out["requests"].extend({**row, "node": o["node"]} for row in rows)
        out["requests"].sort(key=lambda row: -(row.get("latency_ms") or 0.0))
        out["requests"] = out["requests"][:limit]
        out["note"] = "; ".join(notes) + "; the diagnosis stands" if notes else None
        return out

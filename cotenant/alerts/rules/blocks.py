"""The building blocks of the rule files: the settings they are rendered from, one alerting or
recording rule, and the PromQL pieces both files share (the per-model SLO, an SLO alert).

:mod:`alerts.rules.cotenant` and :mod:`alerts.rules.exporters` build their groups from these;
:mod:`alerts.rules.render` renders the groups to YAML. Nothing here imports either of them, so the
three modules form no import cycle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cotenant.core.errors import UsageError
from cotenant.core.slos import BREACH_OP


@dataclass(frozen=True)
class RuleSettings:
    """What the rules are rendered from (``[analysis] slo_ms`` and ``[rules]``).

    ``slo_ms``: p99 SLO per model in milliseconds; ``slo_default_ms``: the SLO of every other
    model (0 = none); ``dram_saturated`` and ``memory_pressure``: ratios 0-1;
    ``pcie_saturated_bps``: bytes per second, TX + RX; ``lock_wait_share``: ratio 0-1 of a
    model's latency spent waiting on locks; ``for_s``: seconds a condition must hold (0 = fire
    at once); ``runbook_base_url``: the URL of ``docs/runbooks.md``.
    """

    slo_ms: Mapping[str, float]
    slo_default_ms: float
    dram_saturated: float
    pcie_saturated_bps: float
    lock_wait_share: float
    memory_pressure: float
    for_s: float
    runbook_base_url: str
    slo_ttft_ms: Mapping[str, float] = field(default_factory=dict)
    slo_tpot_ms: Mapping[str, float] = field(default_factory=dict)
    """Generative models' p99 SLOs of time to first token (ms) and time per output token (ms
    per token), ``[analysis] slo_ttft_ms`` / ``slo_tpot_ms``: their alerts are rendered only
    for the models that have one."""
    scrape_interval_s: float = 15.0
    """How often Prometheus scrapes the agents (``[prometheus] scrape_interval_s``): the
    evaluation interval of the fleet loop's window rules (:mod:`alerts.rules.windows`)."""

    def __post_init__(self) -> None:
        for key, slos in (
            ("slo_ms", self.slo_ms),
            ("slo_ttft_ms", self.slo_ttft_ms),
            ("slo_tpot_ms", self.slo_tpot_ms),
        ):
            for model, ms in slos.items():
                if not model:
                    raise UsageError(f"{key}: a model name is empty")
                if not (math.isfinite(ms) and ms > 0):
                    raise UsageError(f"{key}[{model!r}] = {ms!r}: must be a positive number")
        if not (math.isfinite(self.for_s) and self.for_s >= 0):
            raise UsageError(f"for_s = {self.for_s!r}: must be >= 0")
        if not (math.isfinite(self.scrape_interval_s) and self.scrape_interval_s >= 0.001):
            raise UsageError(
                f"scrape_interval_s = {self.scrape_interval_s!r}: must be a positive number"
            )


@dataclass(frozen=True)
class Alert:
    """One alerting rule; ``anchor`` defaults to the alert name in lower case."""

    name: str
    expr: str
    severity: str
    summary: str
    description: str
    for_s: float | None = None  # None: the settings' for_s
    labels: tuple[tuple[str, str], ...] = ()

    def to_dict(self, s: RuleSettings) -> dict[str, Any]:
        out: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        dur = duration(s.for_s if self.for_s is None else self.for_s)
        if dur is not None:
            out["for"] = dur
        out["labels"] = {"severity": self.severity, **dict(self.labels)}
        out["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": runbook_url(s.runbook_base_url, self.name),
        }
        return out


@dataclass(frozen=True)
class Record:
    record: str
    expr: str

    def to_dict(self) -> dict[str, Any]:
        return {"record": self.record, "expr": self.expr}


def runbook_url(base: str, alert: str) -> str:
    """``base#anchor``: GitHub's anchor of the runbook heading ``## <alert>``."""
    return f"{base}#{alert.lower()}"


def duration(seconds: float) -> str | None:
    """A Prometheus duration (``90s``, ``2m``, ``1500ms``); None for 0."""
    if seconds <= 0:
        return None
    ms = round(seconds * 1000)
    if ms % 60000 == 0:
        return f"{ms // 60000}m"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


def promql_str(text: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def number(x: float) -> str:
    """A float as PromQL reads it, short (``0.9``, ``2e+10``)."""
    return f"{x:g}"


def slo_expr(s: RuleSettings, gauge: str = "cotenant_slo_seconds") -> str:
    """The per-model SLO in seconds: configured constants first, else ``gauge``."""
    parts = [
        f'label_replace(vector({number(ms / 1000)}), "model", {promql_str(m)}, "", "")'
        for m, ms in sorted(s.slo_ms.items())
    ]
    parts.append(f"max by (model) ({gauge})")
    return "\nor\n".join(parts)


def slo_constants(slo_ms: Mapping[str, float]) -> str | None:
    """The per-model SLOs in seconds as constant series ``{model}``; None when there are none."""
    if not slo_ms:
        return None
    return "\nor\n".join(
        f'label_replace(vector({number(ms / 1000)}), "model", {promql_str(m)}, "", "")'
        for m, ms in sorted(slo_ms.items())
    )


def slo_alert_expr(latency: str, slo: str, s: RuleSettings) -> str:
    """``latency`` above its model's SLO (``slo``), or above ``slo_default_ms`` for models
    without one."""
    expr = f"{latency}\n  {BREACH_OP} on (model) group_left ()\n{slo}"
    if s.slo_default_ms > 0:
        expr = (
            f"({expr})\nor\n({latency} {BREACH_OP} {number(s.slo_default_ms / 1000)}"
            f"\n  unless on (model) {slo})"
        )
    return expr


def group(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "rules": rules}

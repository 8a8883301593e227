"""The alerting configuration keys: ``[alerts]`` (the webhook) and ``[rules]`` (rule files)."""

from __future__ import annotations

from dataclasses import dataclass

from cotenant.core.config_key import key


@dataclass(frozen=True)
class AlertSettings:
    """``[alerts]``: the Alertmanager webhook and the diagnosis window around each alert
    (:class:`alerts.webhook.AlertReceiver`)."""

    enabled: bool = key(True, "accept Alertmanager webhooks at POST /api/v1/alerts")
    lookback_s: float = key(
        600.0, "how far before an alert's startsAt its diagnosis looks", min=10.0
    )
    lookahead_s: float = key(
        120.0, "how far after startsAt its diagnosis looks (capped at now)", min=0.0
    )


@dataclass(frozen=True)
class RuleThresholds:
    """``[rules]``: what the rendered Prometheus rules fire at, how long a condition must
    hold, and where their runbooks are. :class:`alerts.rules.render.RuleSettings` is built from
    these and ``[analysis] slo_ms``; the weekly report counts saturation with the same
    ``dram_saturated``, ``pcie_saturated_bps`` and ``memory_pressure``."""

    slo_default_ms: float = key(
        0.0, "p99 SLO for models not in analysis.slo_ms (0 = no SLO alert for them)", min=0.0
    )
    dram_saturated: float = key(
        0.9, "DRAM (memory-bandwidth) utilisation counted as saturated (0-1)", min=0.0, max=1.0
    )
    pcie_saturated_bps: float = key(
        20e9, "PCIe throughput (TX+RX bytes/s) counted as saturated", min=0.0
    )
    lock_wait_share: float = key(
        0.3, "share of a model's latency spent waiting on locks that alerts", min=0.0, max=1.0
    )
    memory_pressure: float = key(
        0.95, "GPU memory used / total that counts as pressure", min=0.0, max=1.0
    )
    for_s: float = key(60.0, "how long a condition must hold before its alert fires", min=0.0)
    runbook_base_url: str = key(
        "https://github.com/cotenant/cotenant/blob/main/docs/runbooks.md",
        "base of the runbook_url annotations",
    )
    labels: dict[str, str] = key(
        {},
        "labels added to the rendered PrometheusRule manifests, e.g. { release = "
        '"kube-prometheus-stack" } where your Prometheus selects rules by its Helm release '
        "(cotenant rules render --label adds more)",
    )
    namespace: str = key(
        "cotenant",
        "namespace of the rendered PrometheusRule manifests (cotenant rules render --namespace)",
    )

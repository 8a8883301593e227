"""The weekly report's reads of a week's per-minute rollups: the contract (a reader contract of
the base layer, like :mod:`cotenant.core.readers`).

:class:`WeekRollups` is what :mod:`cotenant.reports.compute` asks of a week's minutes: per
model its requests, minutes with requests, minutes within its SLO and burstiness; per
generative model its TTFT / TPOT SLO minutes; per GPU its saturated hours and co-tenancy; a
victim's p99 around an action; where model-load latency went (requests' waits per model, loads
per model, replica and kind). Implementations: ``cotenant.store.week_rollups.
StoreWeekRollups`` (embedded mode, DuckDB over the rollup tables) and
``cotenant.collectors.prometheus.week.PromQLWeekRollups`` (fleet mode, PromQL over the
recording rules' minute series). Times are ns UTC, latencies ms, hours as named.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cotenant.core.slos import SloTable


@dataclass(frozen=True)
class GpuThresholds:
    """When a GPU minute counts as saturated: ``sm`` (SM util %, the minute's mean), ``dram``
    (fraction), ``pcie_bps`` (TX + RX), ``memory_full`` (peak used / total) and
    ``throttle_bits`` (NVML clock-event reasons that mean throttling)."""

    sm: float
    dram: float
    pcie_bps: float
    memory_full: float
    throttle_bits: int


class WeekRollups(Protocol):
    """A range ``[lo, hi)`` of per-minute rollups, reduced. Every method raises
    :class:`store.errors.StoreError` (``ReportError`` for the store, ``SourceError`` for
    Prometheus) when the minutes cannot be read."""

    def model_weeks(
        self, lo: int, hi: int, slos: SloTable, *, detail: bool = True
    ) -> dict[str, dict[str, Any]]:
        """Model -> ``requests``, ``errors`` (int), ``minutes`` (minutes with requests),
        ``met`` (of those, minutes whose p99 — the max over the model's GPUs — is within its
        SLO; 0 without one) and ``burst`` (the busiest minute's requests over the median
        minute's; None when unknown) for every model with requests in the range. With
        ``detail`` False only ``requests``, ``minutes`` and ``met`` are exact (the week
        before's totals); ``errors`` is 0 and ``burst`` None."""
        ...

    def token_slo_weeks(
        self, lo: int, hi: int, slo_ms: Mapping[str, Mapping[str, float]]
    ) -> list[dict[str, Any]]:
        """Per generative model with a TTFT or TPOT SLO (``slo_ms``: ``ttft`` / ``tpot`` ->
        model -> ms): ``model``; for each of ``ttft`` and ``tpot``: ``{ind}_minutes``
        (minutes with that p99) and ``{ind}_met`` (of those, within the SLO, the max over the
        model's GPUs; 0 without an SLO). Models with neither SLO or no such minute are left
        out; sorted by model."""
        ...

    def gpu_weeks(self, lo: int, hi: int, t: GpuThresholds) -> list[dict[str, Any]]:
        """Per GPU (and host): ``hours_sampled``, and hours over each threshold ``sm_h``,
        ``dram_h``, ``pcie_h``, ``throttled_h``, ``memory_full_h``; ``models`` and
        ``processes`` (sorted names of its tenants: models with requests, processes serving
        no model over 1 % SM) and ``cotenancy_h`` (hours with two tenants or more). Also
        ``gpu`` and ``host``; sorted by GPU."""
        ...

    def p99_estimate(self, model: str, lo: int, hi: int) -> float | None:
        """``model``'s count-weighted p99 (ms) over the minutes starting in ``[lo, hi)`` (all
        its GPUs); None without requests."""
        ...

    def load_wait_weeks(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """Per model whose requests waited for model loads (their ``other`` phase: a
        ``model.load`` span is booked there, docs/instrumenting.md): ``model``, ``requests``,
        ``latency_ms`` (their summed latency) and ``wait_ms`` (summed ``other`` time, ms).
        Models without any such wait are left out; sorted by ``wait_ms``, largest first."""
        ...

    def load_weeks(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """Per (model, replica, load kind) with loads ending in the range: ``model``,
        ``replica`` (the GPU where no replica was named), ``kind`` (``base``, ``lora``,
        ``controlnet``, ``pipeline``, ``adapter``), ``loads``, ``load_ms`` (summed duration),
        ``max_ms`` (the longest) and ``minutes`` (minutes with a load). Sorted by model, then
        ``load_ms`` largest first. Empty where the loads are not recorded per load (a fleet's
        Prometheus keeps only the requests' waits)."""
        ...

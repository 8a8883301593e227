"""The GPU and Actions sections of the weekly report: the GPUs' hours from the week's rollups
(:class:`store.week_rollups.WeekRollups`), the actions from the store
(:class:`store.report_queries.ReportQueries`)."""

from __future__ import annotations

from typing import Any

from cotenant.core.week_reads import GpuThresholds, WeekRollups
from cotenant.reports.summary import ActionCounts, ActionRow, GpuWeek, Thresholds
from cotenant.store.report_queries import ReportQueries

MINUTE_NS = 60_000_000_000
THROTTLE_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
"""NVML clock-event reasons that mean thermal or power throttling: SW power cap, HW slowdown,
SW thermal, HW thermal, HW power brake (``nvmlClocksEventReason*``)."""
ACTION_WINDOW_NS = 15 * MINUTE_NS
"""p99 before an action is the victim's over the 15 minutes before it was created; after,
over the 15 minutes from when it was applied."""
APPLIED_STATES = ("applied", "verified", "rolled_back", "expired")
HELD_STATES = ("verified", "expired")


def gpu_weeks(rollups: WeekRollups, lo: int, hi: int, t: Thresholds) -> list[GpuWeek]:
    """Per GPU: hours saturated (SM, DRAM, PCIe), throttled, near memory-full, and its
    co-tenancy, from the GPU, request and process rollups."""
    rows = rollups.gpu_weeks(
        lo,
        hi,
        GpuThresholds(
            sm=t.sm_saturated,
            dram=t.dram_saturated,
            pcie_bps=t.pcie_saturated_bps,
            memory_full=t.memory_full,
            throttle_bits=THROTTLE_BITS,
        ),
    )
    return [
        GpuWeek(
            gpu=str(r["gpu"]),
            host=str(r["host"] or ""),
            hours_sampled=float(r["hours_sampled"]),
            sm_saturated_h=float(r["sm_h"]),
            dram_saturated_h=float(r["dram_h"]),
            pcie_saturated_h=float(r["pcie_h"]),
            throttled_h=float(r["throttled_h"]),
            memory_full_h=float(r["memory_full_h"]),
            models=list(r["models"]),
            processes=list(r["processes"]),
            cotenancy_h=float(r["cotenancy_h"]),
        )
        for r in rows
    ]


def action_rows(q: ReportQueries, rollups: WeekRollups, lo: int, hi: int) -> list[ActionRow]:
    """Actions created in ``[lo, hi)`` with the victim's p99 before and after: the control
    loop's own verification numbers (``params.verification``) where it measured them, else
    the rollups' count-weighted p99 over :data:`ACTION_WINDOW_NS` before creation and from
    the time it was applied (``params.applied_ns``, else the audit's ``applied`` event)."""

    def p99(r: dict[str, Any], key: str, lo_ns: int) -> float | None:
        if r[key] is not None or r["victim"] is None:
            return None if r[key] is None else float(r[key])
        return rollups.p99_estimate(str(r["victim"]), lo_ns, lo_ns + ACTION_WINDOW_NS)

    rows = q.actions(lo, hi)
    for r in rows:
        r["p99_before_ms"] = p99(r, "p99_before_ms", int(r["created_ns"]) - ACTION_WINDOW_NS)
        if r["state"] in APPLIED_STATES:
            r["p99_after_ms"] = p99(r, "p99_after_ms", int(r["applied_ns"]))
    return [
        ActionRow(
            id=str(r["id"]),
            incident_id=r["incident_id"],
            kind=str(r["kind"]),
            target=str(r["target"]),
            state=str(r["state"]),
            created_ns=int(r["created_ns"]),
            victim=r["victim"],
            p99_before_ms=r["p99_before_ms"],
            p99_after_ms=None if r["state"] not in APPLIED_STATES else r["p99_after_ms"],
            held_back=bool(r["held_back"]),
        )
        for r in rows
    ]


def count_actions(actions: list[ActionRow]) -> ActionCounts:
    return ActionCounts(
        proposed=len(actions),
        applied=sum(a.state in APPLIED_STATES for a in actions),
        held=sum(a.state in HELD_STATES for a in actions),
        rolled_back=sum(a.state == "rolled_back" for a in actions),
        failed=sum(a.state == "failed" for a in actions),
        held_back=sum(a.held_back for a in actions),
    )

"""The GPU and Actions sections of the weekly report: one DuckDB aggregation each."""

from __future__ import annotations

import duckdb

from reports.summary import ActionCounts, ActionRow, GpuWeek, Thresholds

MINUTE_NS = 60_000_000_000
THROTTLE_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
"""NVML clock-event reasons that mean thermal or power throttling: SW power cap, HW slowdown,
SW thermal, HW thermal, HW power brake (``nvmlClocksEventReason*``)."""
ACTION_WINDOW_NS = 15 * MINUTE_NS
"""p99 before an action is the victim's over the 15 minutes before it was created; after,
over the 15 minutes from when it was applied."""
APPLIED_STATES = ("applied", "verified", "rolled_back", "expired")
HELD_STATES = ("verified", "expired")


def gpu_weeks(cur: duckdb.DuckDBPyConnection, lo: int, hi: int, t: Thresholds) -> list[GpuWeek]:
    """Per GPU: hours saturated (SM, DRAM, PCIe), throttled, near memory-full, and its
    co-tenancy, from ``gpu_rollup_1m``, ``request_rollup_1m`` and ``process_rollup_1m``."""
    rows = cur.execute(
        """
        WITH g AS (
            SELECT host, gpu, count(*) / 60.0 AS sampled,
                count(*) FILTER (WHERE sm_util >= $sm) / 60.0 AS sm_h,
                count(*) FILTER (WHERE coalesce(dram_active, mem_util / 100.0) >= $dram)
                    / 60.0 AS dram_h,
                count(*) FILTER (WHERE coalesce(pcie_tx_bps, 0) + coalesce(pcie_rx_bps, 0)
                    >= $pcie) / 60.0 AS pcie_h,
                count(*) FILTER (WHERE coalesce(clock_event_reasons, 0) & $bits <> 0)
                    / 60.0 AS thr_h,
                count(*) FILTER (WHERE mem_used_bytes_max >= $mem * mem_total_bytes)
                    / 60.0 AS full_h
            FROM gpu_rollup_1m WHERE minute_ns >= $lo AND minute_ns < $hi
            GROUP BY host, gpu),
        tenants AS (
            SELECT minute_ns, gpu, model AS tenant, true AS is_model FROM request_rollup_1m
            WHERE minute_ns >= $lo AND minute_ns < $hi AND count > 0
            UNION
            SELECT minute_ns, gpu, process_name, false FROM process_rollup_1m
            WHERE minute_ns >= $lo AND minute_ns < $hi AND model IS NULL AND sm_util > 1),
        co AS (
            SELECT gpu, count(*) / 60.0 AS co_h FROM (
                SELECT minute_ns, gpu FROM tenants GROUP BY ALL
                HAVING count(DISTINCT tenant) >= 2) GROUP BY gpu),
        names AS (
            SELECT gpu, list(DISTINCT tenant ORDER BY tenant) FILTER (WHERE is_model) AS ms,
                   list(DISTINCT tenant ORDER BY tenant) FILTER (WHERE NOT is_model) AS ps
            FROM tenants GROUP BY gpu)
        SELECT g.gpu, g.host, sampled, sm_h, dram_h, pcie_h, thr_h, full_h,
               coalesce(ms, []), coalesce(ps, []), coalesce(co_h, 0.0)
        FROM g LEFT JOIN co USING (gpu) LEFT JOIN names USING (gpu)
        ORDER BY g.gpu, g.host""",
        {
            "lo": lo,
            "hi": hi,
            "sm": t.sm_saturated,
            "dram": t.dram_saturated,
            "pcie": t.pcie_saturated_bps,
            "bits": THROTTLE_BITS,
            "mem": t.memory_full,
        },
    ).fetchall()
    return [
        GpuWeek(
            gpu=str(r[0]),
            host=str(r[1] or ""),
            hours_sampled=float(r[2]),
            sm_saturated_h=float(r[3]),
            dram_saturated_h=float(r[4]),
            pcie_saturated_h=float(r[5]),
            throttled_h=float(r[6]),
            memory_full_h=float(r[7]),
            models=list(r[8]),
            processes=list(r[9]),
            cotenancy_h=float(r[10]),
        )
        for r in rows
    ]


def action_rows(cur: duckdb.DuckDBPyConnection, lo: int, hi: int) -> list[ActionRow]:
    """Actions created in ``[lo, hi)`` with the victim's p99 before and after: the control
    loop's own verification numbers (``params.verification``) where it measured them, else
    the rollups' count-weighted p99 over :data:`ACTION_WINDOW_NS` before creation and from
    the time it was applied (``params.applied_ns``, else the audit's ``applied`` event)."""
    rows = cur.execute(
        """
        WITH a AS (
            SELECT a.id, a.incident_id, a.kind, a.target, a.state, a.created_ns,
                   i.model AS victim,
                   TRY_CAST(json_extract(a.params_json, '$.verification.victim_p99_before_ms')
                            AS DOUBLE) AS v_before,
                   TRY_CAST(json_extract(a.params_json, '$.verification.victim_p99_after_ms')
                            AS DOUBLE) AS v_after,
                   coalesce(TRY_CAST(json_extract(a.params_json, '$.applied_ns') AS BIGINT),
                            (SELECT min(ts_ns) FROM audit u
                             WHERE u.action_id = a.id AND u.event = 'applied'),
                            a.created_ns) AS applied_ns,
                   EXISTS (SELECT 1 FROM audit u WHERE u.action_id = a.id AND u.event = 'held')
                       AS held_back
            FROM actions a LEFT JOIN incidents i ON i.id = a.incident_id
            WHERE a.created_ns >= $lo AND a.created_ns < $hi)
        SELECT id, incident_id, kind, target, state, created_ns, victim,
            coalesce(v_before, (SELECT sum(p99_ms * count) / sum(count) FROM request_rollup_1m r
             WHERE r.model = a.victim AND r.minute_ns >= a.created_ns - $w
               AND r.minute_ns < a.created_ns)),
            coalesce(v_after, (SELECT sum(p99_ms * count) / sum(count) FROM request_rollup_1m r
             WHERE r.model = a.victim AND r.minute_ns >= a.applied_ns
               AND r.minute_ns < a.applied_ns + $w)),
            held_back
        FROM a ORDER BY created_ns, id""",
        {"lo": lo, "hi": hi, "w": ACTION_WINDOW_NS},
    ).fetchall()
    return [
        ActionRow(
            id=str(r[0]),
            incident_id=r[1],
            kind=str(r[2]),
            target=str(r[3]),
            state=str(r[4]),
            created_ns=int(r[5]),
            victim=r[6],
            p99_before_ms=r[7],
            p99_after_ms=None if r[4] not in APPLIED_STATES else r[8],
            held_back=bool(r[9]),
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

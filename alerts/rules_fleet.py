"""``fleet.rules.yml``: per-minute rollups of the agents' series, for a cluster-wide week.

In fleet mode the weekly report and long dashboard ranges read minutes, not raw windows. These
recording rules keep one sample per minute per series, so a week over a whole cluster is a few
PromQL queries over ~10,080 points per series instead of a scan of every scrape. They mirror
the columns of the embedded store's rollups (``request_rollup_1m``, ``gpu_rollup_1m``,
``process_rollup_1m``; docs/architecture.md), with ``node`` kept where the agents set it:

* ``cotenant:requests:increase_1m {node,model,gpu}`` — requests completed in the minute;
* ``cotenant:request_latency_seconds:sum_1m {node,model,gpu}`` — their summed latency (mean =
  sum / count); ``cotenant:request_errors:increase_1m {node,model,gpu}`` — those that failed;
* ``cotenant:request_latency_seconds:p90_1m|p95_1m {model,gpu}`` (p50 and p99 are in
  ``cotenant.rules.yml``);
* ``cotenant:request_phase_seconds:sum_1m {node,model,gpu,phase}`` — time per phase;
* ``cotenant:lock_wait_seconds:increase_1m {model,gpu,lock,holder}``;
* ``cotenant:gpu_memory_used_bytes:max_1m``, ``cotenant:gpu_memory_total_bytes:max_1m``,
  ``cotenant:gpu_power_watts:avg_1m``, ``cotenant:gpu_sm_clock_ratio:min_1m`` (SM clock over
  its maximum) and ``cotenant:gpu_throttled:max_1m`` (1 when a thermal or power clock-event
  reason was active) ``{host,gpu}``;
* ``cotenant:process_sm_utilization:avg_1m``, ``cotenant:process_memory_used_bytes:max_1m``
  ``{host,gpu,pid,process,model}`` and ``cotenant:process_cpu_cores:avg_1m
  {host,pid,process,model}``.

The group is evaluated every minute (``interval: 1m``) whatever the global interval. The
file's second group, ``cotenant-fleet-windows`` (:mod:`alerts.rules_windows`), holds what
central serve's continuous loop reads every pass, evaluated every scrape interval.
"""

from __future__ import annotations

from typing import Any

from alerts.rule_blocks import Record, RuleSettings
from alerts.rules_cotenant import THROTTLE_REASONS
from alerts.rules_windows import window_group

HIST = "cotenant_request_duration_seconds"
THROTTLE = "|".join(THROTTLE_REASONS)
PROC = "host, gpu, pid, process, model"


def _records() -> list[Record]:
    out = [
        Record(
            "cotenant:requests:increase_1m",
            f'sum by (node, model, gpu) (increase({HIST}_count{{phase="total"}}[1m]))',
        ),
        Record(
            "cotenant:request_latency_seconds:sum_1m",
            f'sum by (node, model, gpu) (increase({HIST}_sum{{phase="total"}}[1m]))',
        ),
    ]
    out.append(
        Record(
            "cotenant:request_errors:increase_1m",
            "sum by (node, model, gpu) (increase(cotenant_request_errors_total[1m]))",
        )
    )
    for q, name in ((0.9, "p90"), (0.95, "p95")):
        out.append(
            Record(
                f"cotenant:request_latency_seconds:{name}_1m",
                f"histogram_quantile({q}, sum by (model, gpu, le) "
                f'(rate({HIST}_bucket{{phase="total"}}[1m])))',
            )
        )
    out += [
        Record(
            "cotenant:request_phase_seconds:sum_1m",
            f'sum by (node, model, gpu, phase) (increase({HIST}_sum{{phase!="total"}}[1m]))',
        ),
        Record(
            "cotenant:lock_wait_seconds:increase_1m",
            "sum by (model, gpu, lock, holder) (increase(cotenant_lock_wait_seconds_total[1m]))",
        ),
        Record(
            "cotenant:gpu_memory_used_bytes:max_1m",
            "max by (host, gpu) (max_over_time(cotenant_gpu_memory_used_bytes[1m]))",
        ),
        Record(
            "cotenant:gpu_memory_total_bytes:max_1m",
            "max by (host, gpu) (max_over_time(cotenant_gpu_memory_total_bytes[1m]))",
        ),
        Record(
            "cotenant:gpu_throttled:max_1m",
            "max by (host, gpu) (max_over_time(cotenant_gpu_clock_event_active"
            f'{{reason=~"{THROTTLE}"}}[1m]))',
        ),
        Record(
            "cotenant:gpu_power_watts:avg_1m",
            "avg by (host, gpu) (avg_over_time(cotenant_gpu_power_watts[1m]))",
        ),
        Record(
            "cotenant:gpu_sm_clock_ratio:min_1m",
            # the maximum clock is a constant of the GPU: the lowest clock over it is the
            # lowest ratio, without a subquery (whose step would be the evaluation interval)
            "min by (host, gpu) (min_over_time(cotenant_gpu_sm_clock_hertz[1m]))\n"
            "/ on (host, gpu)\n"
            "max by (host, gpu) (max_over_time(cotenant_gpu_sm_clock_max_hertz[1m]))",
        ),
        Record(
            "cotenant:process_sm_utilization:avg_1m",
            f"avg by ({PROC}) (avg_over_time(cotenant_gpu_process_sm_utilization_ratio[1m]))",
        ),
        Record(
            "cotenant:process_memory_used_bytes:max_1m",
            f"max by ({PROC}) (max_over_time(cotenant_gpu_process_memory_used_bytes[1m]))",
        ),
        Record(
            "cotenant:process_cpu_cores:avg_1m",
            "avg by (host, pid, process, model) (avg_over_time(cotenant_process_cpu_cores[1m]))",
        ),
    ]
    return out


def fleet_groups(s: RuleSettings) -> list[dict[str, Any]]:
    """The rollup group (it does not depend on ``s``) and the continuous loop's window group
    (:mod:`alerts.rules_windows`, evaluated every ``s.scrape_interval_s``)."""
    return [
        {
            "name": "cotenant-fleet-rollups",
            "interval": "1m",
            "rules": [r.to_dict() for r in _records()],
        },
        window_group(s),
    ]

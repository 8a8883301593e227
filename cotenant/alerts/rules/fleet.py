"""``fleet.rules.yml``: per-minute rollups of the agents' series, for a cluster-wide week.

In fleet mode the weekly report and long dashboard ranges read minutes, not raw windows. These
recording rules keep one sample per minute per series, so a week over a whole cluster is a few
PromQL queries over ~10,080 points per series instead of a scan of every scrape. They mirror
the columns of the embedded store's rollups (``request_rollup_1m``, ``gpu_rollup_1m``,
``process_rollup_1m``; docs/architecture.md), with ``node`` kept where the agents set it:

Every series is the value over one clock minute ``[M, M + 60 s)``, recorded once a minute at
some moment of the following minute (:func:`minute_of`; hence ``_minute``, not ``_1m``, which
names a trailing minute in ``cotenant.rules.yml``):

* ``cotenant:requests:increase_minute {node,model,gpu}`` — requests completed in the minute;
* ``cotenant:request_latency_seconds:sum_minute {node,model,gpu}`` — their summed latency
  (mean = sum / count); ``cotenant:request_errors:increase_minute {node,model,gpu}`` — those
  that failed;
* ``cotenant:request_latency_seconds:p50_minute|p90_minute|p95_minute|p99_minute {model,gpu}``;
* ``cotenant:time_to_first_token_seconds:p99_minute`` and
  ``cotenant:time_per_output_token_seconds:p99_minute {model,gpu}`` (generative models);
* ``cotenant:request_phase_seconds:sum_minute {node,model,gpu,phase}`` — time per phase;
* ``cotenant:lock_wait_seconds:increase_minute {model,gpu,lock,holder}``;
* ``cotenant:gpu_sm_utilization:avg_minute``, ``cotenant:gpu_memory_bandwidth_utilization:
  avg_minute``, ``cotenant:gpu_pcie_bytes_per_second:avg_minute`` (TX + RX),
  ``cotenant:gpu_memory_used_bytes:max_minute``, ``cotenant:gpu_memory_total_bytes:max_minute``,
  ``cotenant:gpu_power_watts:avg_minute``, ``cotenant:gpu_sm_clock_ratio:min_minute`` (SM clock
  over its maximum) and ``cotenant:gpu_throttled:max_minute`` (1 when a thermal or power
  clock-event reason was active) ``{host,gpu}``;
* ``cotenant:process_sm_utilization:avg_minute``, ``cotenant:process_memory_used_bytes:
  max_minute`` ``{host,gpu,pid,process,model}`` and ``cotenant:process_cpu_cores:avg_minute
  {host,pid,process,model}``.
* per model, only in minutes that hold something (the weekly report reduces them in
  Prometheus with plain range functions: :mod:`collectors.prometheus.week`):
  ``cotenant:model_requests:increase_minute``, ``cotenant:model_request_errors:increase_minute``,
  ``cotenant:model_request_latency_seconds:p99_max_minute`` and the TTFT / TPOT
  ``cotenant:model_time_to_first_token_seconds:p99_max_minute``,
  ``cotenant:model_time_per_output_token_seconds:p99_max_minute`` ``{model}`` (the p99 of the
  model's slowest GPU);
* ``cotenant:gpu_tenants:count_minute {gpu}`` — models with requests and processes serving no
  model over 1 % SM on the GPU.

The group is evaluated every minute (``interval: 1m``) whatever the global interval. The
file's second group, ``cotenant-fleet-windows`` (:mod:`alerts.rules.windows`), holds what
central serve's continuous loop reads every pass, evaluated every scrape interval.
"""

from __future__ import annotations

from typing import Any

from cotenant.alerts.rules.blocks import Record, RuleSettings
from cotenant.alerts.rules.cotenant import THROTTLE_REASONS
from cotenant.alerts.rules.windows import window_group

HIST = "cotenant_request_duration_seconds"
THROTTLE = "|".join(THROTTLE_REASONS)
PROC = "host, gpu, pid, process, model"


def minute_of(expr: str) -> str:
    """``expr`` (a value over the trailing ``[1m]``) at the last whole minute before the
    evaluation: a subquery's steps sit on multiples of its resolution, so whatever the offset
    Prometheus gives the group within its interval, the sample recorded at ``t`` is the value
    over the clock minute ``[M - 60 s, M]`` with ``M = floor(t / 60 s) x 60 s``."""
    return f"last_over_time(({expr})[1m:1m])"


def _quantile(q: float, buckets: str = f'{HIST}_bucket{{phase="total"}}') -> str:
    return f"histogram_quantile({q}, sum by (model, gpu, le) (rate({buckets}[1m])))"


def _records() -> list[Record]:
    raw = [
        (
            "cotenant:requests:increase_minute",
            f'sum by (node, model, gpu) (increase({HIST}_count{{phase="total"}}[1m]))',
        ),
        (
            "cotenant:request_latency_seconds:sum_minute",
            f'sum by (node, model, gpu) (increase({HIST}_sum{{phase="total"}}[1m]))',
        ),
        (
            "cotenant:request_errors:increase_minute",
            "sum by (node, model, gpu) (increase(cotenant_request_errors_total[1m]))",
        ),
        *(
            (f"cotenant:request_latency_seconds:{name}_minute", _quantile(q))
            for q, name in ((0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99"))
        ),
        *(
            (f"cotenant:{name}:p99_minute", _quantile(0.99, f"cotenant_{name}_bucket"))
            for name in ("time_to_first_token_seconds", "time_per_output_token_seconds")
        ),
        (
            "cotenant:request_phase_seconds:sum_minute",
            f'sum by (node, model, gpu, phase) (increase({HIST}_sum{{phase!="total"}}[1m]))',
        ),
        (
            "cotenant:lock_wait_seconds:increase_minute",
            "sum by (model, gpu, lock, holder) (increase(cotenant_lock_wait_seconds_total[1m]))",
        ),
        (
            "cotenant:gpu_sm_utilization:avg_minute",
            "avg by (host, gpu) (avg_over_time(cotenant_gpu_sm_utilization_ratio[1m]))",
        ),
        (
            "cotenant:gpu_memory_bandwidth_utilization:avg_minute",
            "avg by (host, gpu) (avg_over_time(cotenant_gpu_memory_utilization_ratio[1m]))",
        ),
        (
            "cotenant:gpu_pcie_bytes_per_second:avg_minute",
            "avg by (host, gpu) (avg_over_time(cotenant_gpu_pcie_transmit_bytes_per_second[1m]))"
            "\n+\n"
            "avg by (host, gpu) (avg_over_time(cotenant_gpu_pcie_receive_bytes_per_second[1m]))",
        ),
        (
            "cotenant:gpu_memory_used_bytes:max_minute",
            "max by (host, gpu) (max_over_time(cotenant_gpu_memory_used_bytes[1m]))",
        ),
        (
            "cotenant:gpu_memory_total_bytes:max_minute",
            "max by (host, gpu) (max_over_time(cotenant_gpu_memory_total_bytes[1m]))",
        ),
        (
            "cotenant:gpu_throttled:max_minute",
            "max by (host, gpu) (max_over_time(cotenant_gpu_clock_event_active"
            f'{{reason=~"{THROTTLE}"}}[1m]))',
        ),
        (
            "cotenant:gpu_power_watts:avg_minute",
            "avg by (host, gpu) (avg_over_time(cotenant_gpu_power_watts[1m]))",
        ),
        (
            "cotenant:gpu_sm_clock_ratio:min_minute",
            # the maximum clock is a constant of the GPU: the lowest clock over it is the
            # lowest ratio
            "min by (host, gpu) (min_over_time(cotenant_gpu_sm_clock_hertz[1m]))\n"
            "/ on (host, gpu)\n"
            "max by (host, gpu) (max_over_time(cotenant_gpu_sm_clock_max_hertz[1m]))",
        ),
        (
            "cotenant:process_sm_utilization:avg_minute",
            f"avg by ({PROC}) (avg_over_time(cotenant_gpu_process_sm_utilization_ratio[1m]))",
        ),
        (
            "cotenant:process_memory_used_bytes:max_minute",
            f"max by ({PROC}) (max_over_time(cotenant_gpu_process_memory_used_bytes[1m]))",
        ),
        (
            "cotenant:process_cpu_cores:avg_minute",
            "avg by (host, pid, process, model) (avg_over_time(cotenant_process_cpu_cores[1m]))",
        ),
        *_per_model(),
        ("cotenant:gpu_tenants:count_minute", _TENANTS),
    ]
    return [Record(name, minute_of(expr)) for name, expr in raw]


_TENANTS = (
    "count by (gpu) (\n"
    "  group by (gpu, tenant) (label_replace(\n"
    f'    sum by (model, gpu) (increase({HIST}_count{{phase="total"}}[1m])) > 0,\n'
    '    "tenant", "$1", "model", "(.*)"))\n'
    "  or\n"
    "  group by (gpu, tenant) (label_replace(\n"
    '    avg_over_time(cotenant_gpu_process_sm_utilization_ratio{model=""}[1m]) > 0.01,\n'
    '    "tenant", "$1", "process", "(.*)"))\n'
    ")"
)
"""A GPU's tenants in the minute: models with requests on it and, by name, processes that
serve no model above 1 % SM (the weekly report's co-tenancy, as embedded mode counts it)."""


def _per_model() -> list[tuple[str, str]]:
    """Per-model minutes, recorded only where they hold something (a model with no request in
    the minute has no sample): the weekly report reduces a week of them in Prometheus with
    plain range functions (``count_over_time`` = minutes with requests, ``max_over_time``,
    ``quantile_over_time``) instead of subqueries over every (model, GPU) series."""
    return [
        (
            "cotenant:model_requests:increase_minute",
            f'sum by (model) (increase({HIST}_count{{phase="total"}}[1m])) > 0',
        ),
        (
            "cotenant:model_request_errors:increase_minute",
            "sum by (model) (increase(cotenant_request_errors_total[1m])) > 0",
        ),
        # the max over the model's GPUs (an upper bound of the pooled p99: the minute met
        # its SLO only when every GPU did); NaN (no request on any GPU) is not recorded
        (
            "cotenant:model_request_latency_seconds:p99_max_minute",
            f"max by (model) ({_quantile(0.99)}) >= 0",
        ),
        *(
            (
                f"cotenant:model_{name}:p99_max_minute",
                f"max by (model) ({_quantile(0.99, f'cotenant_{name}_bucket')}) >= 0",
            )
            for name in ("time_to_first_token_seconds", "time_per_output_token_seconds")
        ),
    ]


def fleet_groups(s: RuleSettings) -> list[dict[str, Any]]:
    """The rollup group (it does not depend on ``s``) and the continuous loop's window group
    (:mod:`alerts.rules.windows`, evaluated every ``s.scrape_interval_s``)."""
    return [
        {
            "name": "cotenant-fleet-rollups",
            "interval": "1m",
            "rules": [r.to_dict() for r in _records()],
        },
        window_group(s),
    ]

"""The PromQL of :class:`collectors.prometheus.source.PrometheusSource` and the pure pieces
around it: the window grid, query texts per exporter, and parsing of ``/api/v1`` answers. No
I/O here.

Each frame is read with one *union* query: several expressions joined with ``or``, each
wrapped in ``label_replace`` to add a ``cotenant_field`` label naming the column it feeds, so
one round trip returns every column of a family of series.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cotenant.collectors.procfs.pod_identity import PodName
from cotenant.core.errors import UsageError
from cotenant.core.readers import check_range
from cotenant.core.timerange import TimeRange

FIELD = "cotenant_field"
"""Label added to tell the parts of one union query apart."""
MAX_POINTS = 10_000  # Prometheus refuses more than 11,000 points per series and query
MIB = 1_048_576
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
OWN = "cotenant_request_duration_seconds"
OWN_ERRORS = "cotenant_request_errors_total"
"""The agents' count of requests whose root span had an error status."""
GPU_BY = ("UUID", "uuid", "gpu", "Hostname", "hostname", "instance")
"""Labels identifying a GPU in DCGM series (see :func:`host_of`, :func:`gpu_of`): dcgm-exporter
names the UUID ``uuid`` under ``--use-old-namespace``, and the host ``hostname`` from its
releases after 4.8."""
POD_BY = (
    "exported_namespace",
    "exported_pod",
    "exported_container",
    "namespace",
    "pod",
    "container",
    "pod_namespace",
    "pod_name",
    "container_name",
)
"""Labels naming the pod of a DCGM series (see :func:`pod_of`), as three triples: the
``exported_*`` ones Prometheus makes of the exporter's labels when its scrape has
``honor_labels: false`` (the dcgm-exporter chart's ServiceMonitor default; ``pod`` is then the
exporter's own pod), dcgm-exporter's own, then the same under ``--use-old-namespace``."""
EXPORTED_POD = 1
"""Index of ``exported_pod`` in :data:`POD_BY`."""
DEVICE_SERIES = ('pod="",pod_name=""', 'exported_pod=""', "")
"""Alternatives selecting a GPU's own series: those of no pod where there are (with
``KUBERNETES_VIRTUAL_GPUS``, dcgm-exporter adds per-pod series of ``DCGM_FI_DEV_GPU_UTIL`` and
``DCGM_FI_DEV_FB_USED`` beside the GPU's), else those not renamed ``exported_pod`` (a scrape
with ``honor_labels: false`` gives every series the exporter's own ``pod``: the GPU's are
those that had none to rename), else its copies labelled with a pod (every other field; the
GPU's value, whoever it is labelled with)."""
POD_SERIES = ('exported_pod!=""', 'pod!=""', 'pod_name!=""')
"""Alternatives selecting the series labelled with a pod, under each label set."""
SPANS_PROBE = f'group(last_over_time({OWN}_count{{phase!="total"}}[1h]))'


@dataclass(frozen=True)
class Grid:
    """``n`` windows of ``step`` ns starting at ``w0``, a multiple of ``step`` (as
    ``StoreSource``). Window ``i`` is the query evaluated at ``w0 + (i + 1) * step``."""

    w0: int
    step: int
    n: int

    @property
    def end(self) -> int:
        return self.w0 + self.n * self.step

    def starts(self) -> np.ndarray:
        return self.w0 + self.step * np.arange(self.n, dtype=np.int64)

    def index(self, ts_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Window index of each window start in ``ts_ns``, and which of them are on the grid."""
        k = (ts_ns - self.w0) // self.step
        return k, (k >= 0) & (k < self.n)


def grid(rng: TimeRange, step_s: float) -> Grid:
    """The windows of ``step_s`` that start in ``rng`` (QueryError / UsageError)."""
    lo, hi, step = check_range(rng, step_s)
    if step % 1_000_000:
        raise UsageError(f"step {step_s} s: Prometheus resolves whole milliseconds")
    w0 = (lo // step) * step
    return Grid(w0, step, (hi - 1 - w0) // step + 1 if hi > lo else 0)


def seconds(ns: int) -> str:
    """An API time or step: decimal seconds, millisecond precision."""
    ms = ns // 1_000_000
    return f"{ms // 1000}.{ms % 1000:03d}"


def duration(ns: float) -> str:
    """A PromQL range duration, rounded up to whole milliseconds."""
    return f"{int(np.ceil(ns / 1e6))}ms"


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def union(parts: Mapping[str, str]) -> str:
    """One query for several expressions, each series tagged ``cotenant_field=<part name>``."""
    return " or ".join(f'label_replace({e}, "{FIELD}", "{f}", "", "")' for f, e in parts.items())


# -- DCGM ------------------------------------------------------------------------------------

GPU_FIELDS = {
    "sm_util": "DCGM_FI_DEV_GPU_UTIL or 100 * DCGM_FI_PROF_SM_ACTIVE",
    "mem_util": "DCGM_FI_DEV_MEM_COPY_UTIL",
    "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "pcie_tx_bps": "DCGM_FI_PROF_PCIE_TX_BYTES",
    "pcie_rx_bps": "DCGM_FI_PROF_PCIE_RX_BYTES",
    "nvlink_tx_bps": "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "nvlink_rx_bps": "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "mem_used_bytes": f"{MIB} * DCGM_FI_DEV_FB_USED",
    "mem_total_bytes": f"{MIB} * (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)",
    "power_w": "DCGM_FI_DEV_POWER_USAGE",
    "temp_c": "DCGM_FI_DEV_GPU_TEMP",
    "sm_clock_mhz": "DCGM_FI_DEV_SM_CLOCK",
    "max_sm_clock_mhz": "DCGM_FI_DEV_MAX_SM_CLOCK",
}
"""Column -> expression; each ``DCGM_FI_*`` name stands for that series' window mean."""
PROCESS_FIELDS = {k: GPU_FIELDS[k] for k in ("sm_util", "mem_util", "mem_used_bytes")}


def dcgm_query(
    fields: Mapping[str, str],
    by: tuple[str, ...],
    sel: str,
    window: str,
    alternatives: tuple[str, ...] = DEVICE_SERIES,
) -> str:
    """Union of ``fields`` with every DCGM name replaced by ``avg by (by) (avg_over_time(
    NAME{alt,sel}[window]))`` for each matcher ``alt`` of ``alternatives``, joined with ``or``
    (per identity, the first that has series)."""
    by_s = ", ".join(by)

    def mean(m: re.Match[str]) -> str:
        parts = [
            f"avg by ({by_s}) (avg_over_time({m.group(1)}"
            f"{{{','.join(x for x in (alt, sel) if x)}}}[{window}]))"
            for alt in alternatives
        ]
        return parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"

    return union({f: re.sub(r"\b(DCGM_FI_\w+)", mean, e) for f, e in fields.items()})


CLOCK_REASONS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
"""The clock-event reasons bitmask, under its current and its older (DCGM < 3.3) name."""
CLOCK_EVENTS_COUNT = "DCGM_EXP_CLOCK_EVENTS_COUNT"
"""dcgm-exporter's own field (commented out in its default counters, like the bitmask): one
gauge per GPU and reason (label ``clock_event``), the number of samples of the bitmask that had
the reason in the ``window_size_in_ms`` before (``--clock-events-count-window-size``, 5 min by
default); a GPU without events has one series, 0, without ``clock_event``."""
CLOCK_EVENT_BITS = {
    "gpu_idle": 0x1,
    "clocks_setting": 0x2,
    "power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}
"""``clock_event`` label -> bit of the reasons bitmask (dcgm-exporter's
``internal/pkg/collector/clock_events_collector.go``, DCGM's ``dcgm_fields.h``)."""


def clock_reasons_query(window: str, sel: str = "") -> str:
    """Raw samples (a matrix) of the clock-event reasons under both of their names, and of
    :data:`CLOCK_EVENTS_COUNT` (one selector: ``or`` does not take range vectors)."""
    more = f",{sel}" if sel else ""
    names = "|".join((*CLOCK_REASONS, CLOCK_EVENTS_COUNT))
    return f'{{__name__=~"{names}"{more}}}[{window}]'


def pod_gpus_query(window: str) -> str:
    """The GPUs each pod's DCGM series name, under either label set."""
    by = ", ".join(("UUID", "uuid", "gpu", *POD_BY))
    return " or ".join(
        f"group by ({by}) (last_over_time(DCGM_FI_DEV_FB_USED{{{m}}}[{window}]))"
        for m in POD_SERIES
    )


def pod_models_query(window: str) -> str:
    """Which model each pod serves, from vLLM, Triton and cotenant series."""
    return " or ".join(
        f'group by (namespace, pod, {label}) (last_over_time({name}{{pod!=""}}[{window}]))'
        for name, label in (
            ("vllm:num_requests_running", "model_name"),
            ("nv_inference_count", "model"),
            (f"{OWN}_count", "model"),
        )
    )


AGENT_PROCESS_BY = ("host", "gpu", "pid", "process", "model")
"""Labels identifying one process in an agent's per-process series."""


def agent_process_query(sel: str, window: str) -> str:
    """A cotenant agent's per-process series (docs/metrics.md) as PROCESS_WINDOWS fields:
    NVML's per-process ratios as percent, memory in bytes, and host CPU in cores (those have
    no ``gpu``: asked for only when ``sel`` does not select a GPU)."""
    by = ", ".join(AGENT_PROCESS_BY)

    def mean(metric: str, scale: str = "") -> str:
        return f"{scale}avg by ({by}) (avg_over_time({metric}{{{sel}}}[{window}]))"

    parts = {
        "sm_util": mean("cotenant_gpu_process_sm_utilization_ratio", "100 * "),
        "mem_util": mean("cotenant_gpu_process_memory_utilization_ratio", "100 * "),
        "mem_used_bytes": mean("cotenant_gpu_process_memory_used_bytes"),
    }
    if "gpu=" not in sel:
        parts["cpu_cores"] = mean("cotenant_process_cpu_cores")
    return union(parts)


def lock_waits_query(model: str, window: str) -> str:
    """Per (lock, holder) of ``model``: requests that waited and seconds waited, over
    ``window`` ending at the query time (agents' ``cotenant_lock_wait*`` counters)."""
    m = f"model={quote(model)}"
    return union(
        {
            "requests": f"sum by (lock, holder) (increase(cotenant_lock_waits_total{{{m}}}"
            f"[{window}]))",
            "seconds": f"sum by (lock, holder) (increase(cotenant_lock_wait_seconds_total"
            f"{{{m}}}[{window}]))",
        }
    )


def owners_query(model: str, gpu: str | None, window: str) -> str:
    """Which agents (node, scrape target) published ``model``'s latency on ``gpu``."""
    sel = [f"model={quote(model)}", 'phase="total"']
    if gpu:
        sel.append(f"gpu={quote(gpu)}")
    return f"group by (node, instance) (last_over_time({OWN}_count{{{','.join(sel)}}}[{window}]))"


def gpu_selectors(gpu: str | None) -> tuple[str, ...]:
    """Label matchers that select one GPU's DCGM series, in the order to try them: its
    ``UUID`` (``uuid`` under ``--use-old-namespace``), else its index in ``gpu`` (exporters
    without UUIDs); ``("",)`` for every GPU."""
    if gpu is None:
        return ("",)
    return (f"UUID={quote(gpu)}", f"uuid={quote(gpu)}", f"gpu={quote(gpu)}")


def host_of(ident: tuple[str, ...]) -> str:
    """Host of a :data:`GPU_BY` identity: ``Hostname``, ``hostname``, else ``instance``."""
    hostname_cap, hostname, instance = ident[3:6]
    return hostname_cap or hostname or instance.rsplit(":", 1)[0]


def uuid_of(ident: tuple[str, ...]) -> str:
    """UUID of a :data:`GPU_BY` identity (``UUID`` or ``uuid``); ``""`` when it has none."""
    return ident[0] or ident[1]


def gpu_of(ident: tuple[str, ...]) -> str:
    """GPU of a :data:`GPU_BY` identity: the UUID, else the index."""
    return ident[0] or ident[1] or ident[2]


def pod_of(labels: tuple[str, ...]) -> PodName | None:
    """The pod of a :data:`POD_BY` tuple of label values, named as agents name processes
    (``str()`` gives ``namespace/pod (container)``); None when no pod is named."""
    for i in range(0, len(labels) - 2, 3):
        ns, pod, container = labels[i : i + 3]
        if pod:
            return PodName(ns, pod, container or None)
    return None


def only(query: str, label: str, value: str) -> str:
    """The series of ``query`` whose ``label`` is ``value`` (for a label PromQL made, which no
    selector can match)."""
    literal = quote(value.replace("$", "$$"))  # label_replace's replacement expands $1
    return f'({query}) and on ({label}) label_replace(vector(1), "{label}", {literal}, "", "")'


# -- answers ---------------------------------------------------------------------------------


def parse_result(result: Any) -> list[tuple[dict[str, str], np.ndarray, np.ndarray]]:
    """``data.result`` (vector, matrix or scalar) -> ``(labels, ts_ns, values)`` per series;
    KeyError / TypeError / ValueError / IndexError on anything else."""
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):
        result = [{"metric": {}, "value": result}]  # a scalar
    if not isinstance(result, list):
        raise TypeError(f"result is a {type(result).__name__}, not a list")
    out = []
    for item in result:
        labels = item["metric"]
        if not isinstance(labels, dict):
            raise TypeError("metric is not an object")
        pairs = item["values"] if "values" in item else [item["value"]]
        ts = np.array([p[0] for p in pairs], dtype=np.float64)
        vals = np.array([p[1] for p in pairs], dtype=np.float64)
        if ts.shape != vals.shape or ts.ndim != 1:
            raise ValueError("a sample is not a [time, value] pair")
        ts_ns = np.rint(ts * 1e3).astype(np.int64) * 1_000_000  # the API speaks milliseconds
        out.append(({str(k): str(v) for k, v in labels.items()}, ts_ns, vals))
    return out


def complaint(message: str) -> str:
    """What the server said, from prometheus-api-client's ``HTTP Status Code 400 (b'...')``:
    the ``error`` of a Prometheus error body, else the status and the start of the body."""
    m = re.match(r"HTTP Status Code (\d+) \((b'.*'|b\".*\")\)\s*$", message, re.S)
    if not m:
        return message[:300]
    try:
        body = ast.literal_eval(m.group(2)).decode("utf-8", "replace")
    except (ValueError, SyntaxError):
        return message[:300]
    try:
        return f"HTTP {m.group(1)}: {json.loads(body)['error']}"[:500]
    except (ValueError, TypeError, KeyError):
        return f"HTTP {m.group(1)}: {body[:300]}"

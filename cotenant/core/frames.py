"""The frames every :class:`store.source.MetricSource` returns: Arrow tables with fixed schemas.

One row per window (``ts_ns`` = window start, windows of ``step_s``) and series. A value the
source cannot know is null (e.g. phases when only exporter metrics exist).
"""

from __future__ import annotations

import pyarrow as pa

from cotenant.core.phases import PHASE_COLUMNS

REQUEST_WINDOWS = pa.schema(
    [
        ("ts_ns", pa.int64()),
        ("model", pa.string()),
        ("gpu", pa.string()),
        ("count", pa.float64()),
        ("rate_rps", pa.float64()),
        ("arrival_rps", pa.float64()),
        ("errors", pa.float64()),
        ("mean_ms", pa.float64()),
        ("p50_ms", pa.float64()),
        ("p95_ms", pa.float64()),
        ("p99_ms", pa.float64()),
        *[(c, pa.float64()) for c in PHASE_COLUMNS],
        ("batch_size_mean", pa.float64()),
    ]
)
"""Per (window, model, gpu): requests completed (count, rate), requests that *arrived* in the
window (``arrival_rps``; sources that only see completions repeat the completion rate), latency
mean and quantiles, mean time per phase (ms per request) and mean batch size."""

GPU_WINDOWS = pa.schema(
    [
        ("ts_ns", pa.int64()),
        ("host", pa.string()),
        ("gpu", pa.string()),
        ("sm_util", pa.float64()),
        ("mem_util", pa.float64()),
        ("dram_active", pa.float64()),
        ("pcie_tx_bps", pa.float64()),
        ("pcie_rx_bps", pa.float64()),
        ("nvlink_tx_bps", pa.float64()),
        ("nvlink_rx_bps", pa.float64()),
        ("mem_used_bytes", pa.float64()),
        ("mem_total_bytes", pa.float64()),
        ("power_w", pa.float64()),
        ("temp_c", pa.float64()),
        ("sm_clock_mhz", pa.float64()),
        ("max_sm_clock_mhz", pa.float64()),
        ("clock_event_reasons", pa.int64()),
    ]
)
"""Per (window, GPU): means of the counters (utilisations in percent 0-100, like NVML;
``dram_active`` 0-1 like DCGM) and the OR of the clock-event reason bits."""

PROCESS_WINDOWS = pa.schema(
    [
        ("ts_ns", pa.int64()),
        ("host", pa.string()),
        ("gpu", pa.string()),
        ("pid", pa.int64()),
        ("process_name", pa.string()),
        ("model", pa.string()),
        ("sm_util", pa.float64()),
        ("mem_util", pa.float64()),
        ("mem_used_bytes", pa.float64()),
        ("cpu_cores", pa.float64()),
        ("cpu_freq_mhz", pa.float64()),
        ("cpu_max_freq_mhz", pa.float64()),
    ]
)
"""Per (window, GPU, process): mean SM / memory utilisation (percent), memory used, host CPU
use in cores where sampled, and the host's mean and maximum CPU frequency (MHz) where read.
Host-only processes have a null ``gpu``."""

SERVING_WINDOWS = pa.schema(
    [
        ("ts_ns", pa.int64()),
        ("model", pa.string()),
        ("gpu", pa.string()),
        ("requests_waiting", pa.float64()),
        ("requests_running", pa.float64()),
        ("kv_cache_usage", pa.float64()),
        ("preemptions_per_s", pa.float64()),
    ]
)
"""Per (window, model): serving-engine gauges (vLLM): queue length, running requests, KV-cache
usage (0-1), preemption rate."""

TOKEN_WINDOWS = pa.schema(
    [
        ("ts_ns", pa.int64()),
        ("model", pa.string()),
        ("gpu", pa.string()),
        ("count", pa.float64()),
        ("ttft_p99_ms", pa.float64()),
        ("ttft_mean_ms", pa.float64()),
        ("tpot_p99_ms", pa.float64()),
        ("tpot_mean_ms", pa.float64()),
        ("prompt_tokens_mean", pa.float64()),
        ("output_tokens_mean", pa.float64()),
        ("prompt_tokens_p99", pa.float64()),
        ("output_tokens_p99", pa.float64()),
    ]
)
"""Per (window, model, gpu), over the requests that carry token counts (generative models):
how many (``count``), time to first token (TTFT) and time per output token (TPOT: ``(e2e -
TTFT) / (output tokens - 1)``, or the compute phase over the output tokens where TTFT is not
known) as p99 and mean in ms, and the prompt and output token counts (mean; p99 only when
asked for, ``lengths=True``). Sources that cannot know a value leave it null."""

LOCK_WAITS = pa.schema(
    [
        ("lock_name", pa.string()),
        ("lock_holder", pa.string()),
        ("requests", pa.int64()),
        ("wait_ms_sum", pa.float64()),
    ]
)
"""Per (lock, holder) over a range for one model: requests that waited and total wait."""

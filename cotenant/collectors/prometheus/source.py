"""``PrometheusSource``: the fleet path's :class:`store.source.MetricSource`, in PromQL.

It reads exporter series from Prometheus or anything that speaks its HTTP API (Thanos, Mimir,
VictoriaMetrics) through ``prometheus-api-client`` and returns the frames of
:mod:`store.frames`, so the analysis runs on a cluster that has these exporters and no spans.
The query texts are in :mod:`collectors.prometheus.promql`, the HTTP calls in
:mod:`collectors.prometheus.client`, the layout of windows as rows in
:mod:`collectors.prometheus.frames`.

**Windows.** Window ``[ts_ns, ts_ns + step)`` starts at a multiple of ``step`` (as in
``StoreSource``) and holds the range query evaluated at ``ts_ns + step``. Gauges are
``avg_over_time(x[g])``, counters ``rate(x[r])``, with ``g = max(step, scrape_interval_s)`` and
``r = max(step, 4 * scrape_interval_s)``: a rate needs two samples, so a step shorter than that
gives overlapping (smoothed) windows rather than empty ones. Steps are whole milliseconds.

**GPU_WINDOWS** (DCGM exporter), keyed by ``UUID`` (``uuid`` under dcgm-exporter's
``--use-old-namespace``; the ``gpu`` index when absent), host from ``Hostname`` / ``hostname``
(else ``instance``), each from the GPU's own series where there are (with
``KUBERNETES_VIRTUAL_GPUS`` dcgm-exporter adds per-pod ones beside them), else the mean of its
copies labelled with pods: ``sm_util`` = ``DCGM_FI_DEV_GPU_UTIL`` (%, like
NVML) or else 100 x ``DCGM_FI_PROF_SM_ACTIVE``; ``mem_util`` = ``DCGM_FI_DEV_MEM_COPY_UTIL`` (%);
``dram_active`` = ``DCGM_FI_PROF_DRAM_ACTIVE`` (0-1); ``pcie_{tx,rx}_bps`` =
``DCGM_FI_PROF_PCIE_{TX,RX}_BYTES`` and ``nvlink_*`` = ``DCGM_FI_PROF_NVLINK_*_BYTES`` (already
bytes/s: gauges despite the name); ``mem_used_bytes`` / ``mem_total_bytes`` = ``FB_USED`` /
``FB_USED + FB_FREE`` (MiB -> bytes); ``power_w`` = ``DCGM_FI_DEV_POWER_USAGE``; ``temp_c`` =
``DCGM_FI_DEV_GPU_TEMP``; ``sm_clock_mhz`` / ``max_sm_clock_mhz`` = ``DCGM_FI_DEV_SM_CLOCK`` /
``DCGM_FI_DEV_MAX_SM_CLOCK``; ``clock_event_reasons`` = bitwise OR of the raw samples of
``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` and its older name ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``.

**PROCESS_WINDOWS**: the per-process series of cotenant agents (``cotenant_gpu_process_*``
from NVML, and host CPU ``cotenant_process_cpu_cores``, with no GPU), keyed by their ``host,
gpu, pid, process, model`` labels; and DCGM series labelled with a pod (``namespace``, ``pod``,
``container``, or ``pod_namespace``, ``pod_name``, ``container_name`` under
``--use-old-namespace``): ``process_name`` = ``namespace/pod (container)`` as agents name
processes, ``pid`` null, ``model`` from the vLLM / Triton / cotenant series of the same pod.
Only on a GPU whose series name two pods or more (dcgm-exporter with
``KUBERNETES_VIRTUAL_GPUS=true``: a copy of every series per pod sharing the GPU, per-pod
values of ``GPU_UTIL`` and ``FB_USED`` since its 4.8.2, the GPU's values otherwise).
Without it dcgm-exporter labels a GPU with one pod, the one it was allocated to, whoever uses
it: those values are the GPU's and make no pod row (the label still places the pod's models on
the GPU). A pod an agent's series name on the same GPU is taken from the agent (per process).

**LOCK_WAITS** from the agents' ``cotenant_lock_waits_total`` / ``cotenant_lock_wait_seconds_total``
(increase over the range); empty where only exporters run.

**Owners** (:meth:`PrometheusSource.owners`): the ``node`` and ``instance`` labels of the agent
series of a (model, GPU), which fleet mode turns into the agent's URL for drill-down.

**REQUEST_WINDOWS**, per model from the first family that has it: cotenant's own
``cotenant_request_duration_seconds{model,gpu,phase}`` (quantiles, mean, every phase;
``errors`` from the agents' ``cotenant_request_errors_total``, raw windows only) — read
from the recorded series of ``fleet.rules.yml``'s ``cotenant-fleet-windows`` group where they
exist for the rate window (:mod:`collectors.prometheus.recorded`: p50, p99, rates per phase; no
p95), from the raw buckets for windows before their first evaluation or without them — else
vLLM (``vllm:e2e_request_latency_seconds`` quantiles and mean; ``queue_ms`` from
``vllm:request_queue_time_seconds``, ``compute_ms`` from ``vllm:request_inference_time_seconds``
when exported), else Triton (means = ``rate(nv_inference_*_duration_us) /
rate(nv_inference_request_success)`` (``nv_inference_count`` when absent), quantiles from
``nv_inference_request_summary_us`` where Triton runs with ``summary_latencies=true`` (over its
own sliding window; null without it),
``queue/h2d/compute/d2h_ms`` from queue / compute_input / compute_infer / compute_output,
``errors`` from ``nv_inference_request_failure``, ``batch_size_mean`` = inferences / executions),
else SGLang, TGI, Ray Serve (:mod:`collectors.prometheus.engines`: end-to-end histograms, TGI's and
Ray Serve's errors; Ray Serve's latency is the replica's processing time, its model
``application/deployment`` as its spans'; TGI's model its ``model`` label, else its ``job``).
Rows are windows with requests; ``count`` = rate x step. ``has_spans`` is True when cotenant's
own phase series exist (an agent ingested spans): probed once, over the last hour, on first use,
and set by any ``request_windows`` that reads them.

**SERVING_WINDOWS** from vLLM gauges (``num_requests_waiting`` / ``running`` summed over
replicas, ``kv_cache_usage_perc`` (``gpu_cache_usage_perc`` before vLLM 0.9) averaged,
``rate(num_preemptions_total)``), else SGLang's, TGI's or Ray Serve's queue and running gauges
(SGLang's ``token_usage`` as the cache use).

**TOKEN_WINDOWS** from vLLM's histograms: ``ttft_*`` from ``vllm:time_to_first_token_seconds``,
``tpot_*`` from ``vllm:time_per_output_token_seconds``, else (current vLLM) its rename
``vllm:inter_token_latency_seconds``, else ``vllm:request_time_per_output_token_seconds`` (p99
and mean, s -> ms), token counts
from ``vllm:request_prompt_tokens`` / ``vllm:request_generation_tokens`` (mean and p99),
else SGLang's and TGI's (:data:`engines.TOKENS`); ``count`` = first tokens per second x
step (TGI, without TTFT: finished requests).

**GPU of a model**: the series' own ``gpu`` label; else the GPU whose DCGM series carry the same
``namespace``/``pod`` (the first UUID when a pod has several); else ``model_gpu``; else
``default_gpu``. Series landing on one ``(model, gpu)`` add up; their quantiles are averaged
weighted by request rate (an approximation, as for ``StoreSource``'s rollups).

**Errors**: every failure (refused, timed out, HTTP error, not JSON, unexpected JSON) raises
:class:`store.errors.SourceError` naming the URL, the query and what to do. Nothing is retried.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cotenant.collectors.prometheus import engines, families, promql, recorded
from cotenant.collectors.prometheus.client import Fields, PromClient, PromQLClient, Series
from cotenant.collectors.prometheus.frames import div, merge, table, windows_with_data
from cotenant.collectors.prometheus.joins import Joins
from cotenant.collectors.prometheus.promql import GPU_BY, QUANTILES, Grid
from cotenant.collectors.settings import PrometheusSettings
from cotenant.core.errors import UsageError
from cotenant.core.frames import (
    GPU_WINDOWS,
    LOCK_WAITS,
    PROCESS_WINDOWS,
    REQUEST_WINDOWS,
    SERVING_WINDOWS,
    TOKEN_WINDOWS,
)
from cotenant.core.phases import PHASES
from cotenant.core.readers import check_range
from cotenant.core.timerange import TimeRange


class PrometheusSource:
    """:class:`store.source.MetricSource` over PromQL (see the module docstring).

    ``url`` is the API root (``http://prometheus:9090``); ``timeout_s`` bounds each HTTP call
    and each query on the server. ``client`` replaces the ``PrometheusConnect`` built here
    (auth, proxies, a test double). ``scrape_interval_s`` is the exporters' scrape interval (it
    sets the shortest rate window); ``model_gpu`` / ``default_gpu`` place models whose series
    name no GPU, as ``[gpu] model_gpu`` does for spans. Every method may raise
    :class:`SourceError`; window arguments raise ``QueryError`` / ``UsageError``.
    """

    def __init__(
        self,
        url: str,
        timeout_s: float = PrometheusSettings.timeout_s,
        *,
        client: PromClient | None = None,
        scrape_interval_s: float = PrometheusSettings.scrape_interval_s,
        model_gpu: Mapping[str, str] | None = None,
        default_gpu: str = "",
    ) -> None:
        if not url:
            raise UsageError("PrometheusSource needs the URL of a Prometheus ([prometheus] url)")
        if not timeout_s > 0 or not scrape_interval_s > 0:
            raise UsageError(f"timeout_s {timeout_s} and scrape_interval_s must be > 0")
        self._api = PromQLClient(url, timeout_s, client)
        self.url = self._api.url
        self.timeout_s = timeout_s
        self._scrape_ns = int(scrape_interval_s * 1e9)
        self._joins = Joins(self._api, model_gpu, default_gpu)
        self._has_spans: bool | None = None

    def close(self) -> None:
        """Release the HTTP connections of the client built here (not an injected one)."""
        self._api.close()

    def __enter__(self) -> PrometheusSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def instant(self, query: str, at_ns: int | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query at ``at_ns`` (default now): one ``(labels, value)`` per series
        (the last sample of each series of a range-vector query)."""
        return self._api.instant(query, at_ns)

    def range(self, query: str, rng: TimeRange, step_s: float) -> list[Series]:
        """``query`` evaluated at the end of each window of ``step_s`` that starts in ``rng``;
        each series' ``ts_ns`` are window starts. Long ranges go in chunks of 10,000 points."""
        return self._api.range(query, rng, step_s)

    def on_grid(self, query: str, g: promql.Grid) -> list[Series]:
        """``query`` evaluated at the end of each window of ``g`` (which may start off the
        step's multiples: an offset read); each series' ``ts_ns`` are window starts."""
        return self._api.on_grid(query, g)

    # -- MetricSource ------------------------------------------------------------------------

    @property
    def has_spans(self) -> bool:
        """True when cotenant's own per-phase series exist (see the module docstring)."""
        if self._has_spans is None:
            self._has_spans = bool(self.instant(promql.SPANS_PROBE))
        return self._has_spans

    def gpu_windows(self, rng: TimeRange, step_s: float, gpu: str | None = None) -> pa.Table:
        g = promql.grid(rng, step_s)
        if g.n == 0:
            return GPU_WINDOWS.empty_table()
        window = promql.duration(max(g.step, self._scrape_ns))
        blocks: dict[tuple[str, ...], Fields] = {}
        sel = ""
        for sel in promql.gpu_selectors(gpu):  # one GPU's series only, not the fleet's
            blocks = self._api.blocks(
                promql.dcgm_query(promql.GPU_FIELDS, GPU_BY, sel, window), g, GPU_BY
            )
            if blocks:
                break
        reasons = self._joins.clock_reasons(g, sel) if blocks else {}
        # One GPU can be exposed twice (a node running both an agent and the DCGM exporter:
        # their series differ in instance, and perhaps Hostname): a UUID names one GPU, so its
        # series are averaged into one row, under the first of its hosts in sort order.
        same: dict[tuple[str, ...], list[tuple[str, str, Fields]]] = defaultdict(list)
        for ident, f in sorted(blocks.items()):
            host, dev = promql.host_of(ident), promql.gpu_of(ident)
            if gpu is None or dev == gpu:
                same[(dev,) if promql.uuid_of(ident) else (host, dev)].append((host, dev, f))
        out = []
        for group in same.values():
            host, dev, _ = group[0]
            f = merge([fi for _, _, fi in group], means=tuple(GPU_WINDOWS.names))
            f["clock_event_reasons"] = next(
                (reasons[(h, d)] for h, d, _ in group if (h, d) in reasons),
                np.full(g.n, np.nan),
            )
            out.append(((host, dev), f, windows_with_data(f)))
        return table(GPU_WINDOWS, g, ("host", "gpu"), out)

    def process_windows(
        self,
        rng: TimeRange,
        step_s: float,
        gpu: str | None = None,
        hosts: Sequence[str] | None = None,
    ) -> pa.Table:
        g = promql.grid(rng, step_s)
        if g.n == 0:
            return PROCESS_WINDOWS.empty_table()
        window = promql.duration(max(g.step, self._scrape_ns))
        out: list[tuple[tuple[Any, ...], Fields, np.ndarray]] = []
        sels = [f"gpu={promql.quote(gpu)}"] if gpu is not None else []
        if hosts is not None:
            alts = "|".join(re.escape(h) for h in hosts)
            sels.append(f"host=~{promql.quote(alts)}")
        agent = promql.agent_process_query(",".join(sels), window)
        named: set[tuple[str, str]] = set()  # (GPU, process name) the agents' series give
        for (host, dev, pid, name, model), f in self._api.blocks(
            agent, g, promql.AGENT_PROCESS_BY
        ).items():
            pid_v = int(pid) if pid.isdigit() else None
            key2 = (host, dev or None, pid_v, name, model or None)
            out.append((key2, f, windows_with_data(f)))
            named.add((dev, name))
        # DCGM's pod series have no host CPU: with hosts (a node's host CPU), agents only
        if hosts is None:
            out[:0] = self._joins.pod_rows(g, gpu, window, named)
        return table(PROCESS_WINDOWS, g, ("host", "gpu", "pid", "process_name", "model"), out)

    def replicas(self, rng: TimeRange) -> dict[tuple[str, str], str]:
        """Exporter series name no replica (the GPU tells them apart): always empty."""
        check_range(rng, 1.0)
        return {}

    def request_counts(self, rng: TimeRange, gpu: str) -> tuple[int, int] | None:
        """None: counting a GPU's requests here costs a query like the windows' own, so the
        loop reads the windows in full instead (``analysis.full_read_s``)."""
        check_range(rng, 1.0)
        return None

    def model_gpus(self, rng: TimeRange) -> list[tuple[str, str]]:
        """(model, gpu) pairs whose request counters grew over the range (one cheap query per
        family, evaluated at the range's end: no quantiles, however large the fleet), placed
        on GPUs as :meth:`request_windows` places them."""
        lo, hi, _ = check_range(rng, 1.0)
        step = max(1000, -(-(hi - lo) // 1_000_000)) * 1_000_000  # whole ms, >= 1 s
        hi -= hi % 1_000_000
        window = promql.duration(max(step, 4 * self._scrape_ns))
        taken: set[str] = set()
        keyed: list[tuple[tuple[str, ...], Fields]] = []
        for fam in engines.FAMILIES:
            idents = [
                tuple(labels.get(b, "") if b else "" for b in fam.by)
                for labels, _ in self.instant(fam.presence(window), hi)
            ]
            mine = {i[0] for i in idents if i[0]} - taken  # preferred family wins
            keyed += [(i, {}) for i in idents if i[0] in mine]
            taken |= mine
        pairs = self._joins.place(keyed, Grid(hi - step, step, 1))
        return sorted((str(m), str(g or "")) for m, g in pairs)

    def request_windows(
        self, rng: TimeRange, step_s: float, model: str | None = None, gpu: str | None = None
    ) -> pa.Table:
        g = promql.grid(rng, step_s)
        if g.n == 0:
            return REQUEST_WINDOWS.empty_table()
        t = self._requests_on(g, step_s, model, gpu)
        if gpu is None:
            return t
        # exporter families place models on GPUs after the query: filter here too
        return t.filter(pc.equal(pc.fill_null(t.column("gpu"), ""), gpu))

    def _requests_on(
        self, g: Grid, step_s: float, model: str | None, gpu: str | None = None
    ) -> pa.Table:
        window_ns = max(g.step, 4 * self._scrape_ns)
        window = promql.duration(window_ns)
        taken: set[str] = set()
        keyed: list[tuple[tuple[str, ...], Fields]] = []
        for fam in engines.FAMILIES:
            more = []
            if gpu is not None and fam.by[1]:
                # a family with its own gpu label: filter in the query (or no GPU: those are
                # placed by pod or configuration below)
                more.append(f"{fam.by[1]}=~{promql.quote(re.escape(gpu) + '|')}")
            if fam.spans:
                ms = [f"{fam.model_label}={promql.quote(model)}"] if model is not None else []
                m = ",".join((*ms, *more))
                blocks = recorded.own_blocks(self._api, fam, g, m, window_ns)
            else:
                blocks = self._api.blocks(fam.requests(model, window, more), g, fam.by)
            mine = {ident[0] for ident in blocks if ident[0]} - taken  # preferred family wins
            for ident, f in blocks.items():
                if ident[0] in mine:
                    keyed.append((ident, f))
                    if fam.spans and any(f"{p}_sum" in f for p in PHASES):
                        self._has_spans = True
            taken |= mine
        nan = np.full(g.n, np.nan)
        out = []
        for key, fs in self._joins.place(keyed, g).items():
            f = merge(fs, means=())
            rate = f.get("rate", nan)
            cols = {
                "count": rate * step_s,
                "rate_rps": rate,
                "arrival_rps": rate,  # exporters count completions only
                "errors": f.get("errors", nan) * step_s,
                "mean_ms": 1e3 * div(f.get("sum", nan), rate),
                "batch_size_mean": div(f.get("items", nan), f.get("execs", nan)),
            }
            for name, _ in QUANTILES:
                cols[f"{name}_ms"] = 1e3 * f.get(name, nan)
            for p in PHASES:
                if f"{p}_sum" in f:
                    cols[f"{p}_ms"] = 1e3 * div(f[f"{p}_sum"], f.get(f"{p}_n", rate))
            out.append((key, cols, rate > 0))
        return table(REQUEST_WINDOWS, g, ("model", "gpu"), out)

    def token_windows(
        self, rng: TimeRange, step_s: float, gpu: str | None = None, *, lengths: bool = False
    ) -> pa.Table:
        """From cotenant's token histograms (agents: TTFT, TPOT, prompt and output tokens per
        model and GPU) and, for models that have none, vLLM's
        ``vllm:time_to_first_token_seconds``, ``vllm:time_per_output_token_seconds`` (or
        its successors, see :data:`families.VLLM_TOKENS`), ``vllm:request_prompt_tokens`` and
        ``vllm:request_generation_tokens``; ``count`` is the requests that got a first token
        in the window. Models with none are absent."""
        g = promql.grid(rng, step_s)
        if g.n == 0:
            return TOKEN_WINDOWS.empty_table()
        window = promql.duration(max(g.step, 4 * self._scrape_ns))
        placed: dict[tuple[str, str], list[Fields]] = defaultdict(list)
        own_sel = "" if gpu is None else f"gpu={promql.quote(gpu)}"
        own = families.token_query(
            own_sel, window, lengths=lengths, names=families.OWN_TOKENS, by=families.OWN_TOKENS_BY
        )
        for (mdl, dev), f in self._api.blocks(own, g, ("model", "gpu")).items():
            if mdl:
                placed[(mdl, dev)].append(f)
        # the agents' series win over the engines', and an engine over those after it
        queries = (
            (engines.token_query(fam, names, window, lengths=lengths), fam.by)
            for fam, names in engines.TOKENS
        )
        preferred = self._preferred(queries, g, {mdl for mdl, _ in placed})
        for key, fs in self._joins.place(preferred, g).items():
            placed[key] += fs
        nan = np.full(g.n, np.nan)
        out = []
        for key, fs in placed.items():
            if gpu is not None and key[1] != gpu:
                continue
            f = merge(fs, means=families.TOKEN_QUANTILES)
            cols = {
                # TGI has no TTFT: its requests are those that finished with output tokens
                "count": f.get("ttft_n", f.get("output_n", nan)) * step_s,
                "ttft_p99_ms": 1e3 * f.get("ttft_p99", nan),
                "ttft_mean_ms": 1e3 * div(f.get("ttft_sum", nan), f.get("ttft_n", nan)),
                "tpot_p99_ms": 1e3 * f.get("tpot_p99", nan),
                "tpot_mean_ms": 1e3 * div(f.get("tpot_sum", nan), f.get("tpot_n", nan)),
                "prompt_tokens_mean": div(f.get("prompt_sum", nan), f.get("prompt_n", nan)),
                "output_tokens_mean": div(f.get("output_sum", nan), f.get("output_n", nan)),
                "prompt_tokens_p99": f.get("prompt_p99", nan),
                "output_tokens_p99": f.get("output_p99", nan),
            }
            out.append((key, cols, windows_with_data(f)))
        return table(TOKEN_WINDOWS, g, ("model", "gpu"), out)

    def _preferred(
        self, queries: Iterable[tuple[str, tuple[str, ...]]], g: Grid, taken: Iterable[str] = ()
    ) -> list[tuple[tuple[str, ...], Fields]]:
        """The series of each (union query, identity labels) in turn, as identity -> fields,
        but for models an earlier query (or ``taken``) already gave."""
        seen = set(taken)
        keyed: list[tuple[tuple[str, ...], Fields]] = []
        for query, by in queries:
            blocks = self._api.blocks(query, g, by)
            mine = {ident[0] for ident in blocks if ident[0]} - seen
            keyed += [(ident, f) for ident, f in blocks.items() if ident[0] in mine]
            seen |= mine
        return keyed

    def lock_waits(self, rng: TimeRange, model: str) -> pa.Table:
        """From cotenant agents' lock counters; exporters carry no lock detail (empty)."""
        lo, hi, _ = check_range(rng, 1.0)
        window = promql.duration(max(hi - lo, 4 * self._scrape_ns))
        found: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
        for labels, v in self.instant(promql.lock_waits_query(model, window), hi):
            key = (labels.get("lock", ""), labels.get("holder", ""))
            found[key][labels.get(promql.FIELD, "")] = v
        rows = [
            (lock, holder, round(f.get("requests", 0.0)), 1e3 * f.get("seconds", 0.0))
            for (lock, holder), f in found.items()
            if f.get("seconds", 0.0) > 0
        ]
        rows.sort(key=lambda r: -r[3])
        return (
            pa.table([pa.array([r[i] for r in rows]) for i in range(4)], schema=LOCK_WAITS)
            if rows
            else LOCK_WAITS.empty_table()
        )

    def owners(self, rng: TimeRange, model: str, gpu: str | None = None) -> list[dict[str, str]]:
        """The agents that published ``model``'s latency (on ``gpu``) in ``rng``: one
        ``{node, instance}`` per agent, as their series label them; empty when no agent did
        (exporter-only models)."""
        lo, hi, _ = check_range(rng, 1.0)
        window = promql.duration(max(hi - lo, 4 * self._scrape_ns))
        got = self.instant(promql.owners_query(model, gpu, window), hi)
        seen = {(lb.get("node", ""), lb.get("instance", "")) for lb, _ in got}
        return [{"node": n, "instance": i} for n, i in sorted(seen)]

    def serving_windows(self, rng: TimeRange, step_s: float, model: str | None = None) -> pa.Table:
        g = promql.grid(rng, step_s)
        if g.n == 0:
            return SERVING_WINDOWS.empty_table()
        gauge_w = promql.duration(max(g.step, self._scrape_ns))
        rate_w = promql.duration(max(g.step, 4 * self._scrape_ns))
        queries = (
            (engines.gauges_query(fam, gauges, model, gauge_w, rate_w), fam.by)
            for fam, gauges in engines.SERVING
        )
        out = []
        for key, fs in self._joins.place(self._preferred(queries, g), g).items():
            f = merge(fs, means=("kv_cache_usage",))
            out.append((key, f, windows_with_data(f)))
        return table(SERVING_WINDOWS, g, ("model", "gpu"), out)

"""The request-latency and token families :class:`collectors.prometheus.source.PrometheusSource`
reads: cotenant's own histograms, vLLM's and Triton's, as :class:`Family` union queries, and
the serving gauges and token queries beside them. The other engines' are in
:mod:`collectors.prometheus.engines`. No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cotenant.collectors.prometheus.promql import (
    FIELD,
    OWN,
    OWN_ERRORS,
    QUANTILES,
    only,
    quote,
    union,
)


@dataclass(frozen=True)
class Family:
    """A request-latency source: the label naming the model, the labels identifying one
    series (model, own GPU or ``""`` for none, namespace, pod) and its union query."""

    model_label: str
    by: tuple[str, str, str, str]
    query: Callable[[str, str], str]  # (model matcher, rate window) -> query
    counter: str  # a selector of its request counter: which series served requests
    spans: bool = False  # its phases come from spans (cotenant's own series)
    model_from: Callable[[str], str] | None = None
    """For series that name no model in one label (Ray Serve, TGI): wraps an expression
    aggregated by ``model_keep`` to add ``model_label`` made of those labels; ``query`` applies
    it itself, and a model is then selected after it (:func:`only`)."""
    model_keep: tuple[str, ...] = ()

    def presence(self, window: str) -> str:
        """The identities of its series that served requests in the ``window`` before the
        query time: cheap (no quantiles), for ``model_gpus``."""
        if self.model_from is None:
            labels = ", ".join(b for b in self.by if b)
            return f"group by ({labels}) (increase({self.counter}[{window}]) > 0)"
        labels = ", ".join((*self.model_keep, *(b for b in self.by[1:] if b)))
        return self.model_from(f"group by ({labels}) (increase({self.counter}[{window}]) > 0)")

    def select(
        self, model: str | None, make: Callable[[str], str], more: Sequence[str] = ()
    ) -> str:
        """``make(matchers)``, a query of this family's series built on label matchers (as
        ``query``: with ``model_from`` applied), for ``model`` (every model when None), its
        series also matching the matchers ``more``."""
        if self.model_from is None:
            ms = [f"{self.model_label}={quote(model)}"] if model is not None else []
            return make(",".join((*ms, *more)))
        q = make(",".join(more))
        return q if model is None else only(q, self.model_label, model)

    def requests(self, model: str | None, window: str, more: Sequence[str] = ()) -> str:
        """Its request query (``query``) over ``window`` for ``model`` (see :meth:`select`)."""
        return self.select(model, lambda m: self.query(m, window), more)


def _own_query(m: str, r: str) -> str:
    by = "model, gpu, namespace, pod"
    total = ",".join(x for x in (m, 'phase="total"') if x)
    per_phase = " or ".join(
        f"label_replace(sum by ({by}, phase) (rate({OWN}_{s}{{{m}}}[{r}])), "
        f'"{FIELD}", "${{1}}_{tag}", "phase", "(.+)")'
        for s, tag in (("sum", "sum"), ("count", "n"))
    )
    quantiles = {
        n: f"histogram_quantile({q}, sum by ({by}, le) (rate({OWN}_bucket{{{total}}}[{r}])))"
        for n, q in QUANTILES
    }
    # the agents' error counter (one series per (node, model, gpu), 0 until a request fails)
    quantiles["errors"] = f"sum by ({by}) (rate({OWN_ERRORS}{{{m}}}[{r}]))"
    return f"{per_phase} or {union(quantiles)}"


def _vllm_query(m: str, r: str) -> str:
    by = "model_name, namespace, pod"

    def rate(metric: str) -> str:
        return f"sum by ({by}) (rate(vllm:{metric}{{{m}}}[{r}]))"

    e2e = "e2e_request_latency_seconds"
    parts = {"rate": rate(f"{e2e}_count"), "sum": rate(f"{e2e}_sum")}
    for n, q in QUANTILES:
        parts[n] = (
            f"histogram_quantile({q}, sum by ({by}, le) (rate(vllm:{e2e}_bucket{{{m}}}[{r}])))"
        )
    for phase, metric in (("queue", "request_queue_time"), ("compute", "request_inference_time")):
        parts[f"{phase}_sum"] = rate(f"{metric}_seconds_sum")
        parts[f"{phase}_n"] = rate(f"{metric}_seconds_count")
    return union(parts)


def _triton_query(m: str, r: str) -> str:
    by = "model, namespace, pod"

    def rate(metric: str, scale: str = "") -> str:
        return f"sum by ({by}) (rate({metric}{{{m}}}[{r}])){scale}"

    parts = {
        "rate": f"{rate('nv_inference_request_success')} or {rate('nv_inference_count')}",
        "errors": rate("nv_inference_request_failure"),
        "sum": rate("nv_inference_request_duration_us", " / 1e6"),
        "items": rate("nv_inference_count"),
        "execs": rate("nv_inference_exec_count"),
    }
    for phase, stage in (
        ("queue", "queue"),
        ("h2d", "compute_input"),
        ("compute", "compute_infer"),
        ("d2h", "compute_output"),
    ):
        parts[f"{phase}_sum"] = rate(f"nv_inference_{stage}_duration_us", " / 1e6")
    for n, q in QUANTILES:
        # optional (--metrics-config=summary_latencies=true): quantiles over Triton's own
        # sliding window, not the rate window; the highest of a model's series (versions)
        sel = ",".join(x for x in (m, f'quantile="{q}"') if x)
        parts[n] = f"max by ({by}) (last_over_time({TRITON_SUMMARY}{{{sel}}}[{r}])) / 1e6"
    return union(parts)


TRITON_SUMMARY = "nv_inference_request_summary_us"
"""Triton's request-latency summary (µs): exposed only with ``summary_latencies=true``."""


FAMILIES: tuple[Family, ...] = (
    Family(
        "model",
        ("model", "gpu", "namespace", "pod"),
        _own_query,
        f'{OWN}_count{{phase="total"}}',
        spans=True,
    ),
    Family(
        "model_name",
        ("model_name", "", "namespace", "pod"),
        _vllm_query,
        "vllm:e2e_request_latency_seconds_count",
    ),
    Family(
        "model",
        ("model", "", "namespace", "pod"),
        _triton_query,
        "nv_inference_count",  # one name: increase() of two would clash once names drop
    ),
)
"""In order of preference: cotenant's own series, vLLM, Triton. Fields: ``rate`` (requests/s),
``errors`` (/s), ``sum`` (latency seconds/s), ``p50/p95/p99`` (s), ``<phase>_sum`` and
``<phase>_n`` (per-phase seconds/s and requests/s; ``_n`` defaults to ``rate``), ``items`` /
``execs`` (inferences and batch executions /s)."""
ALIASES = {"total_sum": "sum", "total_n": "rate"}
"""cotenant's ``phase="total"`` fields under their family-neutral names."""


def serving_query(m: str, gauge_window: str, rate_window: str) -> str:
    """vLLM engine gauges per (model_name, namespace, pod)."""
    by = "model_name, namespace, pod"

    def mean(metric: str, agg: str) -> str:
        return f"{agg} by ({by}) (avg_over_time(vllm:{metric}{{{m}}}[{gauge_window}]))"

    return union(
        {
            "requests_waiting": mean("num_requests_waiting", "sum"),
            "requests_running": mean("num_requests_running", "sum"),
            "kv_cache_usage": f"{mean('kv_cache_usage_perc', 'avg')} or "
            + mean("gpu_cache_usage_perc", "avg"),
            "preemptions_per_s": f"sum by ({by}) "
            f"(rate(vllm:num_preemptions_total{{{m}}}[{rate_window}]))",
        }
    )


TOKEN_QUANTILES = ("ttft_p99", "tpot_p99", "prompt_p99", "output_p99")
"""Fields of :func:`token_query` that are quantiles (averaged, not added, across series)."""


VLLM_TOKENS: dict[str, str | tuple[str, ...]] = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": (
        "vllm:time_per_output_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
    ),
    "prompt": "vllm:request_prompt_tokens",
    "output": "vllm:request_generation_tokens",
}
"""vLLM's token histograms, by :func:`token_query` field prefix. TPOT has alternatives, read in
this order per series: vLLM hid ``time_per_output_token_seconds`` in 0.12 and later removed it
for its per-token rename ``inter_token_latency_seconds`` (same observations: one per output
token); ``request_time_per_output_token_seconds`` (one per request) is the last resort."""
OWN_TOKENS = {
    "ttft": "cotenant_time_to_first_token_seconds",
    "tpot": "cotenant_time_per_output_token_seconds",
    "prompt": "cotenant_request_prompt_tokens",
    "output": "cotenant_request_output_tokens",
}
"""cotenant's (agents' and serve's ``/metrics``) token histograms, by field prefix."""
VLLM_TOKENS_BY = "model_name, namespace, pod"
OWN_TOKENS_BY = "model, gpu"


def token_query(
    m: str,
    r: str,
    *,
    lengths: bool = False,
    names: Mapping[str, str | tuple[str, ...]] = VLLM_TOKENS,
    by: str = VLLM_TOKENS_BY,
) -> str:
    """The TTFT and TPOT histograms (seconds) and the prompt / output token histograms of
    ``names`` (vLLM's by default, per model_name, namespace and pod), summed ``by`` these
    labels: ``<x>_sum`` and ``<x>_n`` (per second) and ``<x>_p99`` for ``x`` in ttft, tpot,
    prompt, output (the token counts' p99 only with ``lengths``). vLLM's TPOT count is of
    output tokens, cotenant's of requests; either way ``tpot_sum / tpot_n`` is a mean TPOT.
    A tuple of names is a list of alternatives joined by ``or``: per label set, the first that
    has series."""
    parts: dict[str, str] = {}
    for x, metric in names.items():
        alts = (metric,) if isinstance(metric, str) else metric

        def summed(suffix: str, labels: str, alts: tuple[str, ...] = alts) -> str:
            return " or ".join(f"sum by ({labels}) (rate({n}{suffix}{{{m}}}[{r}]))" for n in alts)

        parts[f"{x}_sum"] = summed("_sum", by)
        parts[f"{x}_n"] = summed("_count", by)
        if lengths or x in ("ttft", "tpot"):
            parts[f"{x}_p99"] = f"histogram_quantile(0.99, {summed('_bucket', f'{by}, le')})"
    return union(parts)

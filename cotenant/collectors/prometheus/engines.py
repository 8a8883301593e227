"""The PromQL of the serving engines beyond vLLM and Triton (:mod:`collectors.prometheus.promql`):
SGLang, Text Generation Inference (TGI) and Ray Serve, under the names their sources expose,
and the ordered lists :class:`collectors.prometheus.source.PrometheusSource` reads every
engine from. No I/O here.

Names and units, with where they were read:

* **SGLang** (``sgl-project/sglang`` ``python/sglang/srt/metrics/collector.py``, read at
  commit ``00ae9c15``, the 0.5 series; ``--enable-metrics``): histograms in seconds labelled
  ``model_name`` (the served model name; the scheduler's also ``tp_rank`` and others):
  ``sglang:e2e_request_latency_seconds``, ``sglang:time_to_first_token_seconds``,
  ``sglang:inter_token_latency_seconds`` (before it, ``sglang:time_per_output_token_seconds``,
  the name of SGLang's ``docs/references/production_metrics.md``), ``sglang:queue_time_seconds``;
  gauges ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:token_usage`` (used
  share of the KV pool, 0-1); the token-count histograms ``sglang:prompt_tokens_histogram`` /
  ``sglang:generation_tokens_histogram`` only with ``--collect-tokens-histogram``.
* **TGI** (``huggingface/text-generation-inference`` v3.3.7, ``router/src/server.rs``; its
  ``docs/source/reference/metrics.md``): ``metrics-exporter-prometheus`` names counters without
  ``_total`` (``tgi_request_success``, ``tgi_request_count``, ``tgi_request_failure{err}``, as
  its ``assets/tgi_grafana.json`` queries them); histograms in seconds ``tgi_request_duration``
  (end to end), ``tgi_request_queue_duration``, ``tgi_request_validation_duration``,
  ``tgi_request_inference_duration``, ``tgi_request_mean_time_per_token_duration`` (one
  observation per request); counts ``tgi_request_input_length``,
  ``tgi_request_generated_tokens``; gauges ``tgi_queue_size``, ``tgi_batch_current_size``.
  **No model label**: one TGI process serves one model, so the model is the series' ``model``
  label where the scrape sets one (a target label), else the scrape ``job``; no TTFT histogram.
* **Ray Serve** (2.60.0, recorded: tests/fixtures/engines/rayserve-2.60.0/metrics.txt):
  ``ray_serve_deployment_request_counter_total``, ``ray_serve_deployment_error_counter_total``,
  the histogram ``ray_serve_deployment_processing_latency_ms`` (ms, the replica's own time),
  gauges ``ray_serve_deployment_queued_queries`` (per handle: waiting for a replica) and
  ``ray_serve_replica_processing_queries`` (per replica), labelled ``application`` and
  ``deployment``: the model is ``application/deployment``, as Ray Serve's spans name it
  (:mod:`collectors.shapes.rayserve`), so the two join.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cotenant.collectors.prometheus import families, promql
from cotenant.collectors.prometheus.families import Family
from cotenant.collectors.prometheus.promql import QUANTILES, union

MODEL = "cotenant_model"
"""The label the queries of the engines that name no model in one label add to name it."""


def _by(fam: Family) -> str:
    """The labels a family's series are aggregated by before ``model_from``."""
    return ", ".join((*(fam.model_keep or (fam.model_label,)), "namespace", "pod"))


def _histogram(metric: str, m: str, r: str, by: str, scale: str = "") -> dict[str, str]:
    """``p50`` / ``p95`` / ``p99`` of a histogram (its base name), times ``scale``."""
    return {
        n: f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{m}}}[{r}]))){scale}"
        for n, q in QUANTILES
    }


def _rates(by: str, m: str, r: str) -> Callable[..., str]:
    def rate(metric: str, scale: str = "") -> str:
        return f"sum by ({by}) (rate({metric}{{{m}}}[{r}])){scale}"

    return rate


# -- SGLang ------------------------------------------------------------------------------------

SGLANG_BY = "model_name, namespace, pod"


def _sglang_query(m: str, r: str) -> str:
    rate = _rates(SGLANG_BY, m, r)
    e2e = "sglang:e2e_request_latency_seconds"
    parts = {
        "rate": rate(f"{e2e}_count"),
        "sum": rate(f"{e2e}_sum"),
        "queue_sum": rate("sglang:queue_time_seconds_sum"),
        "queue_n": rate("sglang:queue_time_seconds_count"),
        **_histogram(e2e, m, r, SGLANG_BY),
    }
    return union(parts)


def _sglang_gauges(m: str, gauge_window: str, rate_window: str) -> str:
    def mean(metric: str, agg: str) -> str:
        return f"{agg} by ({SGLANG_BY}) (avg_over_time(sglang:{metric}{{{m}}}[{gauge_window}]))"

    return union(
        {
            "requests_waiting": mean("num_queue_reqs", "sum"),
            "requests_running": mean("num_running_reqs", "sum"),
            "kv_cache_usage": mean("token_usage", "avg"),
        }
    )


SGLANG = Family(
    "model_name",
    ("model_name", "", "namespace", "pod"),
    _sglang_query,
    "sglang:e2e_request_latency_seconds_count",
)
SGLANG_TOKENS: dict[str, str | tuple[str, ...]] = {
    "ttft": "sglang:time_to_first_token_seconds",
    "tpot": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    "prompt": "sglang:prompt_tokens_histogram",
    "output": "sglang:generation_tokens_histogram",
}
"""SGLang's token histograms by :func:`families.token_query` field prefix (TPOT: the current
name, else the one before it)."""


# -- TGI ---------------------------------------------------------------------------------------


def tgi_model(expr: str) -> str:
    """``expr`` with :data:`MODEL` = its ``model`` label where set, else its ``job``."""
    by_job = f'label_replace({expr}, "{MODEL}", "$1", "job", "(.*)")'
    return f'label_replace({by_job}, "{MODEL}", "$1", "model", "(.+)")'


TGI_BY = "job, model, namespace, pod"


def _tgi_query(m: str, r: str) -> str:
    rate = _rates(TGI_BY, m, r)
    parts = {
        "rate": rate("tgi_request_success"),
        # the metrics crate registers a counter at its first increment: none yet is 0
        "errors": f"{rate('tgi_request_failure')} or {rate('tgi_request_success')} * 0",
        "sum": rate("tgi_request_duration_sum"),
        **_histogram("tgi_request_duration", m, r, TGI_BY),
    }
    phases = (("queue", "queue"), ("preprocess", "validation"), ("compute", "inference"))
    for phase, stage in phases:
        parts[f"{phase}_sum"] = rate(f"tgi_request_{stage}_duration_sum")
        parts[f"{phase}_n"] = rate(f"tgi_request_{stage}_duration_count")
    return tgi_model(union(parts))


def _queue_gauges(
    by: str, named: Callable[[str], str], waiting: str, running: str
) -> Callable[[str, str, str], str]:
    """The serving gauges' query of an engine whose queue and running counts are the gauges
    ``waiting`` and ``running``, summed by ``by`` and named by ``named``."""

    def query(m: str, gauge_window: str, rate_window: str) -> str:
        def total(metric: str) -> str:
            return f"sum by ({by}) (avg_over_time({metric}{{{m}}}[{gauge_window}]))"

        return named(
            union({"requests_waiting": total(waiting), "requests_running": total(running)})
        )

    return query


_tgi_gauges = _queue_gauges(TGI_BY, tgi_model, "tgi_queue_size", "tgi_batch_current_size")


TGI = Family(
    MODEL,
    (MODEL, "", "namespace", "pod"),
    _tgi_query,
    "tgi_request_count",
    model_from=tgi_model,
    model_keep=("job", "model"),
)
TGI_TOKENS: dict[str, str | tuple[str, ...]] = {
    "tpot": "tgi_request_mean_time_per_token_duration",
    "prompt": "tgi_request_input_length",
    "output": "tgi_request_generated_tokens",
}
"""TGI's token histograms (no TTFT: TGI has none)."""


# -- Ray Serve ---------------------------------------------------------------------------------


def rayserve_model(expr: str) -> str:
    """``expr`` with :data:`MODEL` = ``application/deployment``."""
    return f'label_join({expr}, "{MODEL}", "/", "application", "deployment")'


RAYSERVE_BY = "application, deployment, namespace, pod"
RAYSERVE_LATENCY = "ray_serve_deployment_processing_latency_ms"


def _rayserve_query(m: str, r: str) -> str:
    rate = _rates(RAYSERVE_BY, m, r)
    lat = RAYSERVE_LATENCY
    parts = {
        "rate": rate("ray_serve_deployment_request_counter_total"),
        # Ray creates the error counter's series at the first error: none yet is 0
        "errors": f"{rate('ray_serve_deployment_error_counter_total')} or "
        f"{rate('ray_serve_deployment_request_counter_total')} * 0",
        # the replica's processing time: what the spans' compute_ms measures (the proxy's
        # end-to-end histogram is per application and route, not per deployment)
        "sum": rate(f"{lat}_sum", " / 1e3"),
        "compute_sum": rate(f"{lat}_sum", " / 1e3"),
        "compute_n": rate(f"{lat}_count"),
        **_histogram(lat, m, r, RAYSERVE_BY, " / 1e3"),
    }
    return rayserve_model(union(parts))


_rayserve_gauges = _queue_gauges(
    RAYSERVE_BY,
    rayserve_model,
    "ray_serve_deployment_queued_queries",
    "ray_serve_replica_processing_queries",
)


RAYSERVE = Family(
    MODEL,
    (MODEL, "", "namespace", "pod"),
    _rayserve_query,
    "ray_serve_deployment_request_counter_total",
    model_from=rayserve_model,
    model_keep=("application", "deployment"),
)


# -- every engine ------------------------------------------------------------------------------

FAMILIES: tuple[Family, ...] = (*families.FAMILIES, SGLANG, TGI, RAYSERVE)
"""Request-latency families in order of preference: :data:`families.FAMILIES` (cotenant's own,
vLLM, Triton), then SGLang, TGI, Ray Serve."""

_VLLM = next(f for f in families.FAMILIES if f.counter.startswith("vllm:"))

SERVING: tuple[tuple[Family, Callable[[str, str, str], str]], ...] = (
    (_VLLM, families.serving_query),
    (SGLANG, _sglang_gauges),
    (TGI, _tgi_gauges),
    (RAYSERVE, _rayserve_gauges),
)
"""(family, gauge query (matchers, gauge window, rate window)) for SERVING_WINDOWS, in order
of preference."""

TOKENS: tuple[tuple[Family, Mapping[str, str | tuple[str, ...]]], ...] = (
    (_VLLM, families.VLLM_TOKENS),
    (SGLANG, SGLANG_TOKENS),
    (TGI, TGI_TOKENS),
)
"""(family, token histogram names) for TOKEN_WINDOWS after cotenant's own, in order of
preference."""


def token_query(
    fam: Family, names: Mapping[str, str | tuple[str, ...]], window: str, *, lengths: bool = False
) -> str:
    """:func:`families.token_query` of an engine's ``names``, per its identity labels."""
    q = families.token_query("", window, lengths=lengths, names=names, by=_by(fam))
    return fam.model_from(q) if fam.model_from is not None else q


def gauges_query(
    fam: Family,
    gauges: Callable[[str, str, str], str],
    model: str | None,
    gauge_window: str,
    rate_window: str,
) -> str:
    """An engine's serving gauges (a :data:`SERVING` pair) for ``model`` (every one: None)."""
    return fam.select(model, lambda m: gauges(m, gauge_window, rate_window))


def pod_models_query(window: str) -> str:
    """Which model each pod serves (:func:`promql.pod_models_query`, and the SGLang, TGI and
    Ray Serve series of the pod, their model in :data:`MODEL` for the last two)."""
    sel = f'{{pod!=""}}[{window}]'
    more = (
        f"group by (namespace, pod, model_name) (last_over_time(sglang:num_running_reqs{sel}))",
        tgi_model(f"group by ({TGI_BY}) (last_over_time(tgi_queue_size{sel}))"),
        rayserve_model(
            f"group by ({RAYSERVE_BY}) (last_over_time(ray_serve_replica_processing_queries{sel}))"
        ),
    )
    return " or ".join((promql.pod_models_query(window), *more))

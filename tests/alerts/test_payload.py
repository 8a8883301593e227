"""The webhook body at the edge: Alertmanager's times and labels, parsed exactly."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from cotenant.alerts.payload import parse_payload, parse_time
from cotenant.core.errors import AlertPayloadError

BASE = int(datetime(2026, 12, 2, 15, 0, 0, tzinfo=UTC).timestamp()) * 1_000_000_000


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("2026-12-02T15:00:00Z", BASE),
        ("2026-12-02T15:00:00.123456789Z", BASE + 123_456_789),
        ("2026-12-02T15:00:00.5Z", BASE + 500_000_000),
        ("2026-12-02T17:00:00.000000001+02:00", BASE + 1),
        ("2026-12-02T10:30:00-04:30", BASE),
    ],
)
def test_alertmanager_times_to_the_nanosecond(text: str, ns: int) -> None:
    assert parse_time(text, "startsAt") == ns


@pytest.mark.parametrize("text", ["2026-12-02", "2026-12-02T15:00:00", "2026-02-30T00:00:00Z", 5])
def test_bad_times_name_the_field(text: object) -> None:
    with pytest.raises(AlertPayloadError, match=r"^alerts\[2\]\.startsAt: "):
        parse_time(text, "alerts[2].startsAt")


def test_model_and_gpu_come_from_the_usual_labels() -> None:
    def one(**labels: str) -> tuple[str | None, str | None]:
        body = {
            "version": "4",
            "alerts": [
                {
                    "status": "firing",
                    "labels": {"alertname": "A", **labels},
                    "startsAt": "2026-12-02T15:00:00Z",
                    "fingerprint": "ab12",
                }
            ],
        }
        a = parse_payload(json.dumps(body).encode())[0]
        return a.model, a.gpu

    assert one(model="tts", gpu="gpu0") == ("tts", "gpu0")
    assert one(victim="tts", culprit="sdxl", gpu="GPU-1") == ("tts", "GPU-1")
    assert one(model_name="llama", UUID="GPU-9") == ("llama", "GPU-9")
    assert one(instance="n1:8050") == (None, None)

"""The Alertmanager webhook payload (version 4), parsed and checked once at the edge.

Alertmanager POSTs::

    {"version": "4", "groupKey": "...", "truncatedAlerts": 0, "status": "firing",
     "receiver": "...", "groupLabels": {...}, "commonLabels": {...},
     "commonAnnotations": {...}, "externalURL": "...",
     "alerts": [{"status": "firing", "labels": {...}, "annotations": {...},
                 "startsAt": "<RFC 3339>", "endsAt": "<RFC 3339>",
                 "generatorURL": "...", "fingerprint": "<hex>"}]}

:func:`parse_payload` returns the alerts or raises :class:`store.errors.AlertPayloadError`
naming the field (``alerts[1].startsAt``) and what is wrong with it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cotenant.core.errors import AlertPayloadError

MODEL_LABELS = ("model", "victim", "model_name")
"""Labels naming the model an alert is about, first match wins."""
GPU_LABELS = ("gpu", "UUID")
"""Labels naming the GPU, first match wins (``UUID``: DCGM exporter series)."""

_RFC3339 = re.compile(
    r"^(\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$"
)
_FINGERPRINT = re.compile(r"^[0-9A-Za-z]{1,64}$")


@dataclass(frozen=True)
class ReceivedAlert:
    """One alert of a webhook delivery; times in nanoseconds UTC."""

    fingerprint: str
    status: str  # firing | resolved
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at_ns: int

    @property
    def alertname(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def model(self) -> str | None:
        return next((self.labels[k] for k in MODEL_LABELS if self.labels.get(k)), None)

    @property
    def gpu(self) -> str | None:
        return next((self.labels[k] for k in GPU_LABELS if self.labels.get(k)), None)


def parse_time(text: Any, field: str) -> int:
    """An RFC 3339 time (as Alertmanager writes it, up to nanoseconds) in ns UTC."""
    if not isinstance(text, str):
        raise AlertPayloadError(f"{field}: expected an RFC 3339 time string, got {text!r}")
    m = _RFC3339.match(text)
    if m is None:
        raise AlertPayloadError(f"{field}: {text!r} is not an RFC 3339 time")
    zone = "+00:00" if m.group(3) in ("Z", "z") else m.group(3)
    try:
        dt = datetime.fromisoformat(m.group(1).replace("t", "T").replace(" ", "T") + zone)
    except ValueError as exc:
        raise AlertPayloadError(f"{field}: {text!r} is not a valid time: {exc}") from exc
    frac = (m.group(2) or "").ljust(9, "0")
    try:
        secs = int((dt - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds())
    except OverflowError:  # 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        secs = -1
    ns = secs * 1_000_000_000 + int(frac or 0)
    if not 0 <= ns < 2**63:  # what the store's BIGINT nanoseconds hold
        raise AlertPayloadError(f"{field}: {text!r} is out of range: times go from 1970 to 2262")
    return ns


def _str_map(raw: Any, field: str, required: bool = True) -> dict[str, str]:
    if raw is None and not required:
        return {}
    if not isinstance(raw, dict):
        raise AlertPayloadError(f"{field}: expected an object of strings, got {_kind(raw)}")
    for k, v in raw.items():
        if not isinstance(v, str):
            raise AlertPayloadError(f"{field}.{k}: expected a string, got {_kind(v)}")
        if not (_utf8(k) and _utf8(v)):
            raise AlertPayloadError(f"{field}: {k!r} holds text that is not valid Unicode")
    return dict(raw)


def _utf8(s: str) -> bool:
    """Whether ``s`` can be stored as UTF-8 (JSON's ``\\ud800`` escapes decode to lone
    surrogates, which cannot)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _kind(x: Any) -> str:
    return "null" if x is None else type(x).__name__


def _alert(raw: Any, i: int) -> ReceivedAlert:
    where = f"alerts[{i}]"
    if not isinstance(raw, dict):
        raise AlertPayloadError(f"{where}: expected an object, got {_kind(raw)}")
    status = raw.get("status")
    if status not in ("firing", "resolved"):
        raise AlertPayloadError(f"{where}.status: {status!r} must be 'firing' or 'resolved'")
    labels = _str_map(raw.get("labels"), f"{where}.labels")
    if not labels.get("alertname"):
        raise AlertPayloadError(f"{where}.labels.alertname: missing")
    annotations = _str_map(raw.get("annotations"), f"{where}.annotations", required=False)
    fp = raw.get("fingerprint")
    if not isinstance(fp, str) or not _FINGERPRINT.match(fp):
        raise AlertPayloadError(
            f"{where}.fingerprint: {fp!r} must be Alertmanager's alert fingerprint "
            "(1-64 letters or digits)"
        )
    starts = parse_time(raw.get("startsAt"), f"{where}.startsAt")
    return ReceivedAlert(fp, status, labels, annotations, starts)


def parse_payload(body: bytes) -> list[ReceivedAlert]:
    """The alerts of a version-4 webhook body. Raises AlertPayloadError naming the field."""
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AlertPayloadError(f"body: not JSON ({exc})") from exc
    except RecursionError as exc:
        raise AlertPayloadError("body: JSON nested too deeply") from exc
    if not isinstance(doc, dict):
        raise AlertPayloadError(f"body: expected a JSON object, got {_kind(doc)}")
    version = doc.get("version")
    if version != "4":
        raise AlertPayloadError(
            f"version: {version!r} is not supported (Alertmanager's webhook sends '4')"
        )
    alerts = doc.get("alerts")
    if not isinstance(alerts, list):
        raise AlertPayloadError(f"alerts: expected a list, got {_kind(alerts)}")
    return [_alert(a, i) for i, a in enumerate(alerts)]

"""Backend that POSTs each change as signed JSON to a URL (a chat-ops bot, an operator).

Body: ``{"event": "apply" | "revert" | "notify", "target", "change" | "before" | "action",
"sent_ns"}``, compact JSON, UTF-8. Header ``X-Cotenant-Signature: sha256=<hex>`` is
HMAC-SHA256 of the exact body bytes under ``[actuators] webhook_secret``; the receiver
recomputes it (:func:`sign`) and compares in constant time. A webhook cannot be asked what is
in place, so :meth:`WebhookBackend.current` returns what this backend last sent for the target.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from cotenant.actuators.backend import Change
from cotenant.actuators.backends.http import HttpCaller

SIGNATURE_HEADER = "X-Cotenant-Signature"


def sign(secret: str, body: bytes) -> str:
    """The signature header value of ``body``: ``sha256=<hex digest>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookBackend:
    name = "webhook"

    def __init__(
        self, http: HttpCaller, secret: str, clock_ns: Callable[[], int] = time.time_ns
    ) -> None:
        self._http = http
        self._secret = secret
        self._clock = clock_ns
        self._sent: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def _post(self, payload: dict[str, Any]) -> None:
        payload = {**payload, "sent_ns": self._clock()}
        body = json.dumps(payload, separators=(",", ":"), default=str).encode()
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(self._secret, body)}
        self._http.request("POST", "", content=body, headers=headers)

    def current(self, target: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._sent.get(target, {}))

    def apply(self, change: Change) -> dict[str, Any]:
        change_d = {"kind": change.kind, "target": change.target, "params": change.params}
        self._post({"event": "apply", "target": change.target, "change": change_d})
        with self._lock:
            state = {**self._sent.get(change.target, {}), **change.params}
            self._sent[change.target] = state
            return dict(state)

    def revert(self, target: str, before: dict[str, Any]) -> dict[str, Any]:
        self._post({"event": "revert", "target": target, "before": before})
        with self._lock:
            self._sent[target] = dict(before)
            return dict(before)

    def notify(self, payload: dict[str, Any]) -> None:
        """Send a notify-only action (see :class:`actuators.controller.Notifier`)."""
        self._post(payload)

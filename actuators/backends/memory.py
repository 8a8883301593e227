"""In-memory backend: the test double shipped beside the real ones (STYLE.md).

It keeps each target's settings in a dict, records every call, and can be told to fail
(``fail_next``) so tests drive the failure paths without a network.
"""

from __future__ import annotations

import threading
from typing import Any

from actuators.backend import Change
from store.errors import BackendError

_KEYS = ("rate_rps", "burst", "priority")


class MemoryBackend:
    name = "memory"

    def __init__(self) -> None:
        self.settings: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.fail_next = 0
        self._lock = threading.Lock()

    def _maybe_fail(self, what: str) -> None:
        if self.fail_next > 0:
            self.fail_next -= 1
            raise BackendError(f"memory backend: {what} refused (fail_next)")

    def current(self, target: str) -> dict[str, Any]:
        with self._lock:
            s = self.settings.get(target, {})
            return {k: s.get(k) for k in _KEYS}

    def apply(self, change: Change) -> dict[str, Any]:
        with self._lock:
            self.calls.append(("apply", change.target, dict(change.params)))
            self._maybe_fail("apply")
            s = self.settings.setdefault(change.target, {})
            for k in _KEYS:
                if k in change.params:
                    s[k] = change.params[k]
        return self.current(change.target)

    def revert(self, target: str, before: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.calls.append(("revert", target, dict(before)))
            self._maybe_fail("revert")
            self.settings[target] = {k: before.get(k) for k in _KEYS}
        return self.current(target)

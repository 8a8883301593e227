"""Child spans waiting for their root.

Children usually end, and are exported, before their root; a child whose root is not in the
same export is held here, keyed by ``(trace id, parent span id)``, for up to ``ttl_s``. Held
children that expire, or that are pushed out when more than ``max_spans`` are held, are counted
in :attr:`PendingChildren.expired` by reason (``orphan_child``, ``pending_overflow``). They are
persisted across restarts through :meth:`PendingChildren.export` / :meth:`PendingChildren.restore`.
Not thread-safe: the normalizer's callers serialise.
"""

from __future__ import annotations

import json
from collections import Counter, OrderedDict
from collections.abc import Iterable

from cotenant.collectors.shapes.base import Child

Key = tuple[bytes, bytes]
"""``(trace id, parent span id)``, raw bytes."""


class PendingChildren:
    """Held children by parent, oldest first (see the module docstring)."""

    def __init__(self, ttl_s: float, max_spans: int) -> None:
        self._ttl = ttl_s
        self._max = max_spans
        # key -> (first seen, monotonic s; children)
        self._held: OrderedDict[Key, tuple[float, list[Child]]] = OrderedDict()
        self.count = 0
        """Children held now."""
        self.expired: Counter[str] = Counter()
        """Children dropped so far, by reason (cumulative)."""

    def take(self, key: Key, batch: dict[Key, list[Child]]) -> list[Child]:
        """The children of ``key``: held ones first, then those of ``batch`` (the current
        export, popped from it); both are forgotten."""
        got = batch.pop(key, None) or []
        if self._held:
            held = self._held.pop(key, None)
            if held is not None:
                self.count -= len(held[1])
                got = held[1] + got
        return got

    def peek(self, key: Key, batch: dict[Key, list[Child]]) -> list[Child]:
        """Like :meth:`take`, leaving them held."""
        held = self._held.get(key) if self._held else None
        return (held[1] if held is not None else []) + (batch.get(key) or [])

    def keep(self, children: dict[Key, list[Child]], now: float) -> None:
        """Hold ``children`` (seen at ``now``); past ``max_spans``, the oldest parents' are
        dropped as ``pending_overflow``."""
        for key, lst in children.items():
            held = self._held.get(key)
            if held is None:
                self._held[key] = (now, lst)
            else:
                held[1].extend(lst)
            self.count += len(lst)
        while self.count > self._max and self._held:
            _, (_, lst) = self._held.popitem(last=False)
            self.count -= len(lst)
            self.expired["pending_overflow"] += len(lst)

    def expire(self, now: float) -> None:
        """Drop parents first seen more than ``ttl_s`` before ``now`` (``orphan_child``)."""
        cutoff = now - self._ttl
        while self._held:
            key = next(iter(self._held))
            seen, lst = self._held[key]
            if seen >= cutoff:
                break
            del self._held[key]
            self.count -= len(lst)
            self.expired["orphan_child"] += len(lst)

    def export(self) -> list[tuple[str, bytes]]:
        """Held children as ``(trace_id hex, JSON bytes)``, one item per parent."""
        out = []
        for (trace, parent), (_, lst) in self._held.items():
            payload = json.dumps(
                {
                    "parent": parent.hex(),
                    "children": [[p, s, e, sid.hex(), x] for p, s, e, sid, x in lst],
                }
            ).encode()
            out.append((trace.hex(), payload))
        return out

    def restore(self, items: Iterable[tuple[str, bytes]], now: float) -> int:
        """Hold again children saved by :meth:`export`; returns how many. Raises ValueError
        (``json.JSONDecodeError`` included), KeyError or TypeError on an item that
        :meth:`export` did not write."""
        restored: dict[Key, list[Child]] = {}
        for trace_hex, payload in items:
            d = json.loads(payload)
            key = (bytes.fromhex(trace_hex), bytes.fromhex(d["parent"]))
            restored.setdefault(key, []).extend(
                (int(p), int(s), int(e), bytes.fromhex(sid), x) for p, s, e, sid, x in d["children"]
            )
        self.keep(restored, now)
        return sum(len(v) for v in restored.values())

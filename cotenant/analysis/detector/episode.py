"""Episode state: one slowdown of one indicator, from the window its evidence began to the last
window still consistent with it, and what it was judged against (frozen when it opened)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cotenant.analysis.detector.normal import Normal
from cotenant.core.slos import BREACH, DEGRADATION

TYPICAL = "typical"
"""The channel of a window's typical request: the log of its mean latency."""
TAIL = "tail"
"""The channel of a window's slow tail: the log of its p99 (windows of 3 requests or more)."""
CHANNELS = (TYPICAL, TAIL)


SURE_REQUESTS = 3
"""Requests a slowdown must hold for its size to shorten its wait (one slow request is a blip
however slow)."""


BREACH_WAIT = 1 / 3
"""A breach of the SLO waits at most this share of ``degradation_s`` (10 s at the default): a
few seconds over it with nothing to show for it are a blip (3-s breaches of a model at 0.1
req/s whose own five requests arrived at once), a breach that lasts is news."""


def needs_s(ratio: float, requests: int, degradation_s: float, breach: bool = False) -> float:
    """How long a slowdown, ``ratio`` times its normal over ``requests`` requests, must last
    before it is an incident: until its duration times its excess (``ratio - 1``) reaches
    ``degradation_s``, and never longer than ``degradation_s`` — at the default 30 s: 30 s up
    to 2x, 10 s at 4x, one second at 31x (a reload that holds a model's requests for seconds is
    no blip however briefly it lasts); over its SLO (``breach``), never longer than
    :data:`BREACH_WAIT` of it. Under :data:`SURE_REQUESTS` requests, ``degradation_s`` (its
    breach share) whatever the size."""
    most = degradation_s * BREACH_WAIT if breach else degradation_s
    if requests < SURE_REQUESTS or not math.isfinite(ratio) or ratio <= 2.0:
        return most
    return min(most, degradation_s / (ratio - 1.0))


def lasts_s(e: Episode, count: np.ndarray, degradation_s: float) -> float:
    """:func:`needs_s` of episode ``e`` of a series whose requests per window are ``count``."""
    n = int(np.nansum(np.asarray(count, dtype=np.float64)[e.start : e.end + 1]))
    return needs_s(e.ratio, n, degradation_s, e.breach)


@dataclass(frozen=True)
class Episode:
    """Window indices ``[start, end]`` (inclusive) of one slowdown; ``opened``: the window at
    which the decision fired (for a carried episode, its ``start``); ``peak``: its slowest
    window. ``strong``: it crossed the incident threshold (else it is *weak*: evidence enough
    only for a fellow victim of an incident already found). ``normal``: the channel's normal,
    frozen when it opened; ``delta``: the shift (calibrated standard deviations) the CUSUM that
    fired is tuned to, which its closing test compares with. ``open``: still slow at the last
    window judged."""

    start: int
    end: int
    opened: int
    peak: int
    open: bool
    channel: str
    strong: bool
    normal: Normal
    delta: float
    severity: str = DEGRADATION
    carried: bool = False
    ratio: float = math.nan  # the channel's median during over its normal's (a slowdown's size)
    deflate: float = 1.0  # the long-run deflation of its evidence (the closing test's too)
    like: int = 0  # earlier slowdowns as high in the baseline's memory (ordinary contention)
    until: int = -1  # the first window with a sample after it (how long it lasted, at least)

    @property
    def baseline_ms(self) -> float:
        return self.normal.baseline_ms

    @property
    def breach(self) -> bool:
        return self.severity == BREACH

    def carry(self, offset: int) -> Carry:
        """What the next pass needs to continue this episode when its windows start
        ``offset`` windows later."""
        return Carry(
            self.start - offset,
            self.channel,
            self.normal,
            self.delta,
            self.deflate,
            self.severity,
            self.strong,
        )


@dataclass(frozen=True)
class Carry:
    """An episode open before the windows read (``start`` may be negative): its channel, the
    normal and shift it is judged against, its severity so far."""

    start: int
    channel: str
    normal: Normal
    delta: float
    deflate: float = 1.0
    severity: str = DEGRADATION
    strong: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The frozen part, kept with the incident (the start is kept as a time)."""
        return {
            "channel": self.channel,
            "normal": self.normal.to_dict(),
            "delta": self.delta,
            "deflate": self.deflate,
            "strong": self.strong,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], start: int, severity: str) -> Carry:
        return cls(
            start,
            str(d["channel"]),
            Normal.from_dict(d["normal"]),
            float(d["delta"]),
            float(d.get("deflate", 1.0)),
            severity,
            bool(d.get("strong", True)),
        )

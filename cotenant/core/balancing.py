"""How requests are shared among a model's weighted replicas: the two policies, as pure
algorithms over the candidates of one pick.

* :func:`smooth_weighted` — smooth weighted round robin (nginx's): over any window of
  sum(weights) requests each candidate gets its weight's share, interleaved (weights 5, 1, 1
  send a a b a c a a, not a a a a a b c).
* :func:`two_choices` — power of two choices: two distinct candidates drawn at random in
  proportion to their weights, the one with fewer requests in flight per unit of weight wins
  (a tie, as between idle replicas: the first drawn, so idle replicas share requests by
  weight). Its cost does not grow with the number of replicas, and unlike "always the least
  loaded" it does not send a burst of new requests to the one replica that just freed.

The admission gateway routes live requests with them and the simulator models that routing
with them, so a benchmarked route behaves as the deployed one. Which replicas are candidates
(weight, health, room) is the caller's business; every candidate here has a weight > 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar


class Weighted(Protocol):
    """A candidate replica: its ``weight`` (> 0), the round robin's running score ``current``
    (kept by the caller between picks, 0 at first) and its requests ``in_flight``."""

    weight: int
    current: int

    @property
    def in_flight(self) -> int: ...


W = TypeVar("W", bound=Weighted)


def smooth_weighted(candidates: Sequence[W]) -> W:
    """The next candidate by smooth weighted round robin; updates the candidates' ``current``.
    ``candidates`` is not empty, in a stable order from one pick to the next."""
    total = 0
    best = candidates[0]
    for m in candidates:
        m.current += m.weight
        total += m.weight
        if m.current > best.current:
            best = m
    best.current -= total
    return best


def two_choices(candidates: Sequence[W], rand: Callable[[], float]) -> W:
    """The less loaded (per unit of weight) of two distinct candidates drawn by weight with
    ``rand`` (uniform in [0, 1), two calls). ``candidates`` holds at least two."""
    total = 0
    for m in candidates:
        total += m.weight
    x = rand() * total
    a = candidates[-1]
    for m in candidates:
        x -= m.weight
        if x < 0:
            a = m
            break
    x = rand() * (total - a.weight)
    b = a
    for m in candidates:
        if m is not a:
            b = m
            x -= m.weight
            if x < 0:
                break
    # fewer in flight per unit of weight (as nginx's least_conn); a tie goes to the first
    # drawn, which was drawn by weight
    return a if a.in_flight * b.weight <= b.in_flight * a.weight else b

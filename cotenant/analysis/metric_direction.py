"""Which way a metric moves when it hurts: one table of metric families, by name.

Evidence is direction-aware: a fall of a "higher is better" metric (a clock, a CPU frequency,
availability, free memory, bandwidth headroom) is evidence exactly like a rise of a cost
(utilisation, queue length, waiting, errors). :func:`family_of` classifies a metric name
(``sm-clock``, ``cpu_freq_mhz``, ``availability``, ``latency-p90``...) into a
:class:`Family` by the words it holds; :func:`harmful` turns a series into one where larger is
worse, so every scorer (the tabular mode, the attribution's tests, the published baselines'
candidate series) can rank rises alone.

Words are matched whole against the name split at ``-``, ``_``, ``.``, ``/``, spaces and
camel-case humps (``cpuFreq`` is ``cpu`` + ``freq``); the first family with a matching word wins,
so ``cpu-freq`` is a clock (``freq``) before it is utilisation (``cpu``), ``mem-free`` is
headroom before it is memory use, and DCGM's ``CLOCK_THROTTLE_REASONS`` (a bitmask that rises
from 0 when the clock is held down) is throttling before it is a clock. Names no family knows
are costs (a rise hurts), which is what a resource or traffic counter is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

import numpy as np


class Direction(StrEnum):
    """Which move of a metric is evidence of harm."""

    RISE = "rise"  # a cost: utilisation, queue, wait, errors, traffic
    FALL = "fall"  # a capacity: clock, frequency, availability, headroom
    EITHER = "either"  # latency: slower is harm, and a service failing fast answers faster


@dataclass(frozen=True)
class Family:
    name: str
    direction: Direction
    words: frozenset[str]


def _family(name: str, direction: Direction, words: str) -> Family:
    return Family(name, direction, frozenset(words.split()))


FAMILIES: tuple[Family, ...] = (
    _family("availability", Direction.FALL, "success availability avail uptime apdex hitrate hit"),
    _family(
        "errors",
        Direction.RISE,
        "error errors fail failed failure failures exception "
        "exceptions timeout timeouts retrans retransmits drop drops dropped reject rejected "
        "5xx 4xx restarts restart oom evictions preemptions",
    ),
    # before clocks: a clock's throttle or event *reasons* (DCGM's bitmask) rise when it is held
    _family(
        "throttling",
        Direction.RISE,
        "throttle throttled throttling steal pressure psi reason reasons",
    ),
    _family(
        "clock",
        Direction.FALL,
        "clock clocks clk pclk mclk smclk gclk freq frequency cpufreq mhz ghz khz",
    ),
    _family("headroom", Direction.FALL, "headroom free available idle remaining"),
    _family("latency", Direction.EITHER, "latency latencies duration rt ttft tpot e2e"),
    _family("queue", Direction.RISE, "queue queued wait waiting pending backlog"),
    _family(
        "utilisation",
        Direction.RISE,
        "util utilization utilisation usage cpu mem memory gpu sm busy active load power temp "
        "load1 load5 load15 loadavg",
    ),
    _family(
        "traffic",
        Direction.RISE,
        "workload requests request qps rps ops throughput "
        "bandwidth bps bytes net rx tx syscall io disk pcie nvlink",
    ),
)
"""Metric families, matched in this order (see the module doc)."""

COST = Family("cost", Direction.RISE, frozenset())
"""What a name no family knows is taken for."""

_SPLIT = re.compile(r"[-_./\s:]+")
_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def words_of(metric: str) -> list[str]:
    """The lower-case words of a metric name (see the module doc)."""
    return [w.lower() for w in _SPLIT.split(_HUMP.sub(" ", metric)) if w]


def family_of(metric: str) -> Family:
    """The family of ``metric`` (its name, without the entity), :data:`COST` if none."""
    words = set(words_of(metric))
    for f in FAMILIES:
        if words & f.words:
            return f
    return COST


def direction_of(metric: str) -> Direction:
    return family_of(metric).direction


SHORTFALL_FLOOR = 0.001
"""Smallest spread of a rate's shortfall, as a share of its bound: one request in a thousand
(a baseline with no failure at all does not make one failed request an infinite shift)."""


def rate_bound(x: np.ndarray) -> float:
    """The bound of a rate of the availability family: 100 when the series is in percent (a
    value over 1), else 1."""
    finite = np.asarray(x, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return 100.0 if len(finite) and float(finite.max()) > 1.0 + 1e-9 else 1.0


def shortfall(x: np.ndarray) -> tuple[np.ndarray, float]:
    """A rate of the availability family (availability, success, hit rate) as its shortfall
    from its bound (:func:`rate_bound`), larger is worse, and that bound. A rate near its
    bound is judged by what it misses: 99.9 % to 98 % is twenty times the failures, which a
    spread taken on the rate itself (5 % of 99.9) would call nothing."""
    bound = rate_bound(x)
    return bound - np.asarray(x, dtype=np.float64), bound


def harmful(x: np.ndarray, direction: Direction) -> np.ndarray:
    """``x`` oriented so that larger is worse: negated for a :attr:`Direction.FALL` metric,
    unchanged otherwise (an EITHER metric is judged on both signs by its caller)."""
    out: np.ndarray = -x if direction == Direction.FALL else x
    return out

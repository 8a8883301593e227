"""Reading cotenant's request windows from the fleet's recorded series instead of raw buckets.

``cotenant rules render`` writes a group (``cotenant-fleet-windows`` in ``fleet.rules.yml``,
:mod:`alerts.rules.windows`) that Prometheus evaluates every scrape interval: per (model, GPU,
namespace, pod) the p50 and p99 of the last ``R`` and per phase the seconds and requests per
second, ``R`` being the rate window :class:`collectors.prometheus.source.PrometheusSource` uses (4 x
the scrape interval). Reading those costs Prometheus a lookup per series and window, where the
raw query evaluates ``histogram_quantile`` over every bucket of every pair for every window.

A window read from them holds the latest evaluation at or before the window's end: up to one
evaluation interval (the scrape interval) older than the raw query's value at that instant,
and windows shorter than the interval repeat a value. p95 is not recorded (null).

The names are built here from the rate window, so a source whose window has no rule (a step
longer than ``R``, or rules rendered for another scrape interval) finds no series and reads
raw buckets, as it does for the windows before the rules' first evaluation
(:func:`own_blocks`, which :class:`PrometheusSource` reads cotenant's own family with).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from cotenant.collectors.prometheus import families, promql
from cotenant.collectors.prometheus.client import Fields, PromQLClient
from cotenant.collectors.prometheus.promql import Grid, quote

PREFIX = "cotenant:window_"


def suffix(window_ns: int) -> str:
    """The rate window as the rule names spell it (``1m``, ``40s``, ``1500ms``), as
    :func:`alerts.rules.blocks.duration` writes it."""
    ms = -(-window_ns // 1_000_000)
    if ms % 60_000 == 0:
        return f"{ms // 60_000}m"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


def names(window_ns: int) -> dict[str, str]:
    """Field -> recorded series for the rate window ``window_ns``: ``p50``, ``p99``,
    ``phase_sum`` and ``phase_n``."""
    r = suffix(window_ns)
    return {
        "p50": f"{PREFIX}latency_seconds:p50_rate{r}",
        "p99": f"{PREFIX}latency_seconds:p99_rate{r}",
        "phase_sum": f"{PREFIX}phase_seconds:rate{r}",
        "phase_n": f"{PREFIX}phase_requests:rate{r}",
    }


def own_query(m: str, window_ns: int) -> str:
    """One selector of every recorded series of the window ``window_ns`` (``m``: more label
    matchers, comma-separated, may be empty). A bare selector, not a union: PromQL evaluates
    ``label_replace`` and ``or`` at every step of a range query, which cost Prometheus 3-4
    times the lookups themselves; :func:`field_of` names the columns on this side instead."""
    alts = "|".join(re.escape(n) for n in names(window_ns).values())
    return "{" + ",".join(x for x in (f"__name__=~{quote(alts)}", m) if x) + "}"


def field_of(labels: Mapping[str, str], kinds: Mapping[str, str]) -> str | None:
    """The column of cotenant's own family (:func:`collectors.prometheus.families._own_query`:
    ``p50``, ``p99``, ``<phase>_sum``, ``<phase>_n``) a series of :func:`own_query` feeds; ``kinds``
    is :func:`names` inverted (series -> kind)."""
    what = kinds.get(labels.get("__name__", ""))
    if what in ("p50", "p99"):
        return what
    if what is None or not labels.get("phase"):
        return None
    return f"{labels['phase']}_{'sum' if what == 'phase_sum' else 'n'}"


def own_blocks(
    api: PromQLClient, fam: families.Family, g: Grid, m: str, window_ns: int
) -> dict[tuple[str, ...], Fields]:
    """cotenant's own family (``fam``) on ``g`` as :meth:`PromQLClient.blocks` gives it: from
    the recorded windows where they exist, and from raw buckets (``fam``'s query) for the
    windows before the first one they hold (rules loaded later than the range starts, or not
    at all: then the whole range is raw, at the cost of one query that finds nothing)."""
    rec: dict[tuple[str, ...], Fields] = {}
    kinds = {v: k for k, v in names(window_ns).items()}
    for labels, ts, vals in api.on_grid(own_query(m, window_ns), g):
        name = field_of(labels, kinds)
        if name is None:
            continue
        fields = rec.setdefault(tuple(labels.get(b, "") for b in fam.by), {})
        k, ok = g.index(ts)
        fields.setdefault(name, np.full(g.n, np.nan))[k[ok]] = vals[ok]
    first = g.n
    for f in rec.values():
        for a in f.values():
            have = np.flatnonzero(~np.isnan(a))
            if have.size:
                first = min(first, int(have[0]))
    if first == 0:
        return rec
    lead = Grid(g.w0, g.step, first)
    raw = api.blocks(fam.query(m, promql.duration(window_ns)), lead, fam.by)
    for ident, f in raw.items():
        dst = rec.setdefault(ident, {})
        for name, a in f.items():
            dst.setdefault(name, np.full(g.n, np.nan))[:first] = a
    return rec

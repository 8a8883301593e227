"""What the dashboard reads, aggregated in the store (DuckDB over the rollups and windows,
through :mod:`store.dashboard_queries`, :mod:`store.incident_rows` and
:class:`store.source.StoreSource`).

Every function returns small, chart-ready results — per-window series or one row per model /
GPU / incident — never raw request rows. Ranges longer than :data:`ROLLUP_ABOVE_S` are read at
whole-minute steps, which :class:`store.source.StoreSource` serves from the per-minute rollups;
shorter ranges are windowed from the raw rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from cotenant.analysis.attribution import Cause
from cotenant.analysis.incident_record import Incident
from cotenant.analysis.incidents import IncidentBook
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.readers import MetricSource
from cotenant.core.slos import TPOT, TTFT, Slos
from cotenant.core.timerange import TimeRange
from cotenant.dashboard.theme import Colours
from cotenant.dashboard.timerange import Range
from cotenant.store.dashboard_queries import (
    GPU_TILE_KEYS,
    earliest_data_ns,
    gpu_tiles_raw,
    gpu_tiles_rollup,
    has_gpu_samples,
    has_requests,
    known_models,
    recent_latency,
    rollup_models,
)
from cotenant.store.db import Store
from cotenant.store.incident_rows import incidents_version, live_incident_counts
from cotenant.store.source import StoreSource

NOW_WINDOW_NS = 60_000_000_000
EARLIEST_TTL_S = 60.0
""""Now" on the tiles is the last minute of the range."""
ROLLUP_ABOVE_S = 1800
"""Ranges longer than this are charted from the per-minute rollups."""


def step_for(rng: Range) -> int:
    """Window width in seconds for ``rng``'s charts (whole minutes above ROLLUP_ABOVE_S)."""
    step = rng.step_s
    if (rng.until_ns - rng.since_ns) / 1e9 > ROLLUP_ABOVE_S:
        step = max(60, step - step % 60)
    return step


def _aligned(rng: Range, step_s: int, since_ns: int | None = None) -> TimeRange:
    """The range with its start floored to the step grid (so refreshes reuse windows)."""
    step = step_s * 1_000_000_000
    lo = rng.since_ns if since_ns is None else max(rng.since_ns, since_ns)
    return TimeRange(lo - lo % step, rng.until_ns)


def _last_whole(lo: int, hi: int) -> TimeRange:
    """The last whole window of ``hi - lo`` ending at or before ``hi``, on that window's grid
    (a grid window ending after ``hi`` would ask a PromQL engine about the future)."""
    step = hi - lo
    end = hi - hi % step
    return TimeRange(end - step, end)


@dataclass(frozen=True)
class Cols:
    """An Arrow table as plain column lists (what plotly wants)."""

    data: dict[str, list[Any]]

    @classmethod
    def of(cls, t: pa.Table) -> Cols:
        return cls({n: t.column(n).to_pylist() for n in t.column_names})

    def __getitem__(self, k: str) -> list[Any]:
        return self.data[k]

    def __len__(self) -> int:
        return len(next(iter(self.data.values()), []))

    def where(self, col: str, value: Any) -> Cols:
        keep = [i for i, v in enumerate(self.data[col]) if v == value]
        return Cols({k: [v[i] for i in keep] for k, v in self.data.items()})


class RequestDrill(Protocol):
    """The slowest requests of a (model, GPU) in a range, from wherever they are kept (fleet
    mode: the agent that owns the GPU; ``cotenant.app.fleet_drill.AgentDrill``). The answer has
    ``requests`` (dicts of the ``requests`` columns plus ``node``), ``agents`` and ``note``
    (why some are missing, e.g. a node unreachable; None when nothing is)."""

    def slowest(
        self, model: str, gpu: str | None, since_ns: int, until_ns: int, limit: int = 20
    ) -> dict[str, Any]: ...


class DashboardData:
    """Typed reads for the pages. Thread-safe: each call takes its own cursor."""

    def __init__(
        self,
        store: Store,
        *,
        source: MetricSource | None = None,
        drill: RequestDrill | None = None,
        book: IncidentBook | None = None,
        slos: Slos | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        otlp_hint: str = "http://127.0.0.1:4318/v1/traces",
    ) -> None:
        """``source``: where windows are read (default the store; fleet mode: Prometheus);
        ``drill``: where an incident's slowest requests come from (fleet mode);
        ``clock_ns``: what "now" is (the demo passes its virtual clock); ``otlp_hint``: the
        OTLP endpoint named by the empty states; ``slos``: every model's SLOs (the
        analysis' own, so a card is red exactly when its incident is a breach)."""
        self.slos = slos or Slos()
        self.indicator_slo_ms = {ind: self.slos.explicit(ind) for ind in (TTFT, TPOT)}
        self.store = store
        self.source: MetricSource = source or StoreSource(store)
        self.drill = drill
        self.book = book or IncidentBook(store)
        self.clock_ns = clock_ns
        self.otlp_hint = otlp_hint
        self.colours = Colours()
        self._colours_learned = False
        self._earliest: tuple[float, int | None] = (-1e9, None)  # (monotonic read time, value)

    @property
    def fleet(self) -> bool:
        """Windows come from a source other than the store (fleet mode: Prometheus), so what
        exists and the tiles are read from it too."""
        return not isinstance(self.source, StoreSource)

    def _recent(self, seconds: float) -> TimeRange:
        now = self.clock_ns()
        return TimeRange(now - int(seconds * 1e9), now)

    def learn_colours(self) -> None:
        """Number every model the store knows once, so colours agree across pages."""
        if not self._colours_learned:
            if self.fleet:
                names = sorted({m for m, _ in self.source.model_gpus(self._recent(3600))})
            else:
                names = known_models(self.store)
            self.colours.learn(names)
            self._colours_learned = bool(names)

    # ---- what exists -------------------------------------------------------------------
    def has_requests(self) -> bool:
        if self.fleet:
            return bool(self.source.model_gpus(self._recent(3600)))
        return has_requests(self.store)

    def has_gpu_samples(self) -> bool:
        if self.fleet:
            return bool(self.source.gpu_windows(self._recent(300), 60.0).num_rows > 0)
        return has_gpu_samples(self.store)

    def earliest_ns(self) -> int | None:
        """Oldest record in the store (requests, GPU samples, their rollups); None in fleet
        mode (what Prometheus holds is not asked) or when nothing is stored. Re-read at most
        every :data:`EARLIEST_TTL_S` once known: only retention moves it."""
        if self.fleet:
            return None
        read_at, value = self._earliest
        if value is None or time.monotonic() - read_at > EARLIEST_TTL_S:
            value = earliest_data_ns(self.store)
            self._earliest = (time.monotonic(), value)
        return value

    # ---- Overview ----------------------------------------------------------------------
    def model_tiles(self, rng: Range) -> list[dict[str, Any]]:
        """Per model seen in the range: p99 and requests/s over the range's last minute,
        its SLO, and its live incidents: ``open_incidents`` counts those open and those still
        being diagnosed (found, cause not settled yet), ``diagnosing`` the latter."""
        lo, hi = rng.until_ns - NOW_WINDOW_NS, rng.until_ns
        if self.fleet:
            now = self._fleet_latency(lo, hi)
            seen = {m for m, _ in self.source.model_gpus(TimeRange(rng.since_ns, hi))}
        else:
            now = recent_latency(self.store, lo, hi)
            seen = rollup_models(self.store, rng.since_ns - rng.since_ns % 60_000_000_000, hi)
        live_by = live_incident_counts(self.store)
        out = []
        for m in sorted(seen | set(now)):
            n, p99 = now.get(m, (0, None))
            out.append(
                {
                    "model": m,
                    "p99_ms": p99,
                    "rps": n / (NOW_WINDOW_NS / 1e9),
                    "slo_ms": self.slos.of(m),
                    "open_incidents": sum(live_by.get(m, {}).values()),
                    "diagnosing": live_by.get(m, {}).get("diagnosing", 0),
                }
            )
        return out

    def gpu_tiles(self, rng: Range) -> list[dict[str, Any]]:
        """Per GPU: mean counters over the range's last minute (from the rollup of the
        newest minute when raw samples have expired); keys
        :data:`store.dashboard_queries.GPU_TILE_KEYS`."""
        lo, hi = rng.until_ns - NOW_WINDOW_NS, rng.until_ns
        if self.fleet:
            return self._fleet_gpu_tiles(lo, hi)
        return gpu_tiles_raw(self.store, lo, hi) or gpu_tiles_rollup(self.store, rng.since_ns, hi)

    def _fleet_latency(self, lo: int, hi: int) -> dict[str, tuple[int, float | None]]:
        """Per model over ``[lo, hi)`` from the source's windows: (requests, the highest p99
        of its GPUs' windows: histogram quantiles do not add up across series)."""
        t = self.source.request_windows(_last_whole(lo, hi), (hi - lo) / 1e9)
        out: dict[str, tuple[int, float | None]] = {}
        for m, n, p99 in zip(
            t.column("model").to_pylist(),
            t.column("count").to_pylist(),
            t.column("p99_ms").to_pylist(),
            strict=True,
        ):
            c, p = out.get(m, (0, None))
            worst = p if p99 is None else p99 if p is None else max(p, p99)
            out[m] = (c + round(n or 0), worst)
        return out

    def _fleet_gpu_tiles(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """:data:`store.dashboard_queries.GPU_TILE_KEYS` per GPU from the source's newest
        window of ``[lo, hi)``."""
        t = self.source.gpu_windows(_last_whole(lo, hi), (hi - lo) / 1e9)
        tiles: dict[str, dict[str, Any]] = {}
        for r in t.to_pylist():  # one row per GPU and window: the newest wins
            tx, rx = r.get("pcie_tx_bps"), r.get("pcie_rx_bps")
            tiles[r["gpu"]] = {
                **{k: r.get(k) for k in GPU_TILE_KEYS},
                "pcie_bps": None if tx is None and rx is None else (tx or 0.0) + (rx or 0.0),
            }
        return [tiles[g] for g in sorted(tiles)]

    def latency(
        self,
        rng: Range,
        *,
        model: str | None = None,
        gpu: str | None = None,
        since_ns: int | None = None,
    ) -> Cols:
        """Per-window latency, rate and phases (REQUEST_WINDOWS) over the range, or only from
        ``since_ns`` on (a live refresh asks for the windows after those it has)."""
        step = step_for(rng)
        tr = _aligned(rng, step, since_ns)
        return Cols.of(self.source.request_windows(tr, float(step), model=model, gpu=gpu))

    def tokens(self, rng: Range, *, model: str | None = None, gpu: str | None = None) -> Cols:
        """Per-window TTFT, TPOT and token counts (TOKEN_WINDOWS) of the generative models
        over the range (only ``model``'s when given); empty when no request carries tokens."""
        step = step_for(rng)
        t = Cols.of(
            self.source.token_windows(_aligned(rng, step), float(step), gpu=gpu, lengths=True)
        )
        return t.where("model", model) if model is not None else t

    def gpus(self, rng: Range, gpu: str | None = None) -> Cols:
        step = step_for(rng)
        return Cols.of(self.source.gpu_windows(_aligned(rng, step), float(step), gpu=gpu))

    def processes(self, rng: Range, gpu: str | None = None) -> Cols:
        step = step_for(rng)
        return Cols.of(self.source.process_windows(_aligned(rng, step), float(step), gpu=gpu))

    # ---- incidents ---------------------------------------------------------------------
    def incidents(self, rng: Range, limit: int = 200) -> list[Incident]:
        """Incidents overlapping the range, open ones first, then newest first."""
        until = None if rng.live else rng.until_ns  # a live range is open-ended
        found = self.book.find(since_ns=rng.since_ns, until_ns=until, limit=limit)
        return sorted(found, key=lambda i: (i.state != "open", -i.start_ns))

    def incidents_changed_ns(self) -> int:
        """Newest ``updated_ns`` in the incidents table (0 when empty): refreshes re-read the
        list only when this moves."""
        return incidents_version(self.store)

    def incident(self, incident_id: str) -> Incident | None:
        return self.book.get(incident_id)

    def evidence(self, inc: Incident, cause: Cause, rng: Range) -> dict[str, Any] | None:
        """The series behind one cause over ``rng``: ``{"name", "unit", "x", "y"}``, or None
        when the store has no series for it (e.g. ``unknown``)."""
        kind, culprit = cause.kind, cause.culprit
        gpu = inc.gpu or None
        if kind in (CauseKind.COTENANT, CauseKind.CPU):
            col = "sm_util" if kind == CauseKind.COTENANT else "cpu_cores"
            p = self.processes(rng, gpu=gpu if kind == CauseKind.COTENANT else None)
            sel = [
                i
                for i, (n, m) in enumerate(zip(p["process_name"], p["model"], strict=True))
                if culprit in (n, m)
            ]
            if sel:
                unit = "%" if col == "sm_util" else "cores"
                label = "SM utilisation" if col == "sm_util" else "host CPU"
                return _series(f"{culprit} {label}", unit, p, col, sel)
            if kind == CauseKind.COTENANT:
                r = self.latency(rng, model=culprit)
                if len(r):
                    return _series(f"{culprit} requests/s", "req/s", r, "rate_rps")
            return None
        if kind == CauseKind.BANDWIDTH:
            g = self.gpus(rng, gpu=gpu)
            res = cause.resource or "dram"
            if res == "pcie":
                y = [_sum(a, b) for a, b in zip(g["pcie_tx_bps"], g["pcie_rx_bps"], strict=True)]
                return {
                    "name": f"{gpu} PCIe throughput",
                    "unit": "GB/s",
                    "x": g["ts_ns"],
                    "y": [None if v is None else v / 1e9 for v in y],
                }
            if res == "nvlink":
                y = [
                    _sum(a, b) for a, b in zip(g["nvlink_tx_bps"], g["nvlink_rx_bps"], strict=True)
                ]
                return {
                    "name": f"{gpu} NVLink throughput",
                    "unit": "GB/s",
                    "x": g["ts_ns"],
                    "y": [None if v is None else v / 1e9 for v in y],
                }
            return _series(f"{gpu} memory-controller busy", "%", g, "mem_util")
        if kind == CauseKind.MIX:  # the token count whose change explains more of the excess
            ev = cause.evidence
            which = "prompt" if ev.get("prefill_ms", 0) > ev.get("decode_ms", 0) else "output"
            t = self.tokens(rng, model=inc.model, gpu=gpu)
            if not len(t):
                return None
            return _series(f"{inc.model} mean {which} tokens", "tokens", t, f"{which}_tokens_mean")
        if kind == CauseKind.THROTTLE:
            return _series(f"{gpu} SM clock", "MHz", self.gpus(rng, gpu=gpu), "sm_clock_mhz")
        if kind == CauseKind.MEMORY:
            g = self.gpus(rng, gpu=gpu)
            return {
                "name": f"{gpu} memory used",
                "unit": "GiB",
                "x": g["ts_ns"],
                "y": [None if v is None else v / 2**30 for v in g["mem_used_bytes"]],
            }
        if kind == CauseKind.LOCK:
            return _series(
                f"{inc.model} wait on lock {culprit}",
                "ms/request",
                self.latency(rng, model=inc.model, gpu=gpu),
                "lock_wait_ms",
            )
        if kind == CauseKind.LOAD:
            return _series(
                f"{inc.model} arrivals",
                "req/s",
                self.latency(rng, model=inc.model, gpu=gpu),
                "arrival_rps",
            )
        return None


def _sum(a: float | None, b: float | None) -> float | None:
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)


def _series(
    name: str, unit: str, c: Cols, col: str, rows: list[int] | None = None
) -> dict[str, Any]:
    idx = range(len(c)) if rows is None else rows
    return {
        "name": name,
        "unit": unit,
        "x": [c["ts_ns"][i] for i in idx],
        "y": [c[col][i] for i in idx],
    }

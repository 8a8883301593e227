"""``cotenant demo``: the whole service on a fresh store, fed by a simulated shared GPU.

The built-in scenario (``simulator/scenarios/demo.yaml``) is paced at ``--speed`` x real time
(default 10x): its spans go through the real OTLP exporter into the service, its GPU counters
through a FakeNvml that the service's real NVML collector polls. Incidents are printed with
their ranked causes as the analysis loop finds them. When the scenario ends, the service keeps
serving the dashboard and API with everything it recorded (virtual time then runs at the wall
clock's pace, so the recording stays in the dashboard's recent ranges) until Ctrl-C;
``--duration`` stops it at that wall time either way. Virtual time runs ``speed`` x faster than
the wall clock during the scenario, so timestamps in the store run ahead of the wall clock.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from cotenant.analysis.attribution import Cause
from cotenant.analysis.incident_record import Incident, IncidentEvent
from cotenant.cli.argtypes import seconds
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.errors import CotenantError, UsageError
from cotenant.core.slos import E2E, TPOT, TTFT

if TYPE_CHECKING:
    from cotenant.app.config import Config
    from cotenant.simulator.scenario import Scenario

DEMO_STORE = "./.cotenant/demo.duckdb"


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo",
        help="run the service on a simulated shared GPU (make demo)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument(
        "--scenario",
        default="demo",
        help="bundled scenario name or a scenario file (default: demo)",
    )
    p.add_argument(
        "--speed", type=float, default=10.0, help="virtual seconds per wall second (default 10)"
    )
    p.add_argument(
        "--duration",
        type=seconds,
        default=None,
        help="stop after this much wall time: seconds or with a unit (90s, 4m; "
        "default: run the whole scenario, then keep serving what it recorded until Ctrl-C)",
    )
    p.add_argument(
        "--store", default=DEMO_STORE, help=f"store file, recreated (default {DEMO_STORE})"
    )
    p.add_argument("--config", metavar="FILE", help="TOML config (ports, SLOs, …)")
    p.set_defaults(func=cmd_demo)


class VirtualClock:
    """Wall time mapped onto the simulation: ``start_ns + elapsed_wall x speed``, then, after
    :meth:`real_time`, one virtual second per wall second from where it stood."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self.start_ns = time.time_ns()
        # (virtual ns, wall monotonic s, rate) of the current segment, swapped as one object
        self._seg = (self.start_ns, time.monotonic(), speed)

    def __call__(self) -> int:
        v0, w0, rate = self._seg
        return v0 + int((time.monotonic() - w0) * rate * 1e9)

    def real_time(self) -> None:
        """From now on, run at the wall clock's pace (the scenario is over)."""
        self._seg = (self(), time.monotonic(), 1.0)

    def virtual_s(self, ts_ns: int) -> float:
        return (ts_ns - self.start_ns) / 1e9


def _fresh_store(path: str) -> None:
    p = Path(path)
    for f in (p, p.with_name(p.name + ".wal")):
        if f.exists():
            f.unlink()


def demo_config(cfg: Config, scenario: Scenario, *, store: str, speed: float) -> Config:
    """``cfg`` for a demo of ``scenario`` at ``speed`` x real time on the store ``store``: the
    fake NVML on, polls and passes paced in virtual seconds, and the scenario's SLOs (end to
    end, TTFT, TPOT; :meth:`Scenario.slos`) under the configuration's own."""
    slos = scenario.slos()  # the configuration's own SLOs win over the scenario's
    return dataclasses.replace(
        cfg,
        store=dataclasses.replace(cfg.store, path=store),
        nvml=dataclasses.replace(
            cfg.nvml,
            enabled=True,
            host=scenario.host,
            poll_interval_s=max(0.05, 1.0 / speed),
            process_interval_s=max(0.05, 1.0 / speed),  # one virtual second, like polls
        ),
        # ingest lags by about a wall second (writer flush, NVML batches): that is `speed`
        # virtual seconds, which every analysis pass must re-read
        analysis=dataclasses.replace(
            cfg.analysis,
            slo_ms={**slos.explicit(E2E), **cfg.analysis.slo_ms},
            slo_ttft_ms={**slos.explicit(TTFT), **cfg.analysis.slo_ttft_ms},
            slo_tpot_ms={**slos.explicit(TPOT), **cfg.analysis.slo_tpot_ms},
            interval_s=max(0.2, 5.0 / speed),
            reread_s=max(30.0, 5.0 * speed),
        ),
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from cotenant.app.config import load_config
    from cotenant.app.service import Service
    from cotenant.simulator.nvml_feed import fake_for, feed_rows
    from cotenant.simulator.scenario_load import find_scenario, load_scenario
    from cotenant.simulator.stream import stream

    if not args.speed > 0:
        raise UsageError("--speed must be a positive number")
    scenario = load_scenario(find_scenario(args.scenario))
    cfg = demo_config(
        load_config(args.config or os.environ.get("COTENANT_CONFIG")),
        scenario,
        store=args.store,
        speed=args.speed,
    )
    _fresh_store(args.store)
    clock = VirtualClock(args.speed)
    fake, uuids = fake_for(scenario, clock)
    printer = _IncidentPrinter(clock)
    service = Service(cfg, nvml=fake, clock_ns=clock, on_incident=printer)
    runner = threading.Thread(target=service.run, name="cotenant-serve", daemon=True)
    runner.start()
    if not service.started.wait(60) or service.endpoints is None:
        raise CotenantError("the service did not start: see the log above")
    ep = service.endpoints
    print(
        f"\ncotenant demo: scenario {scenario.name!r} at {args.speed:g}x real time "
        f"({scenario.duration_s / args.speed:.0f} s); store {args.store}"
    )
    print(f"  API and metrics: {ep.api}/api/v1/incidents  {ep.api}/metrics")
    print("  Dashboard: " + ep.api + "/   Ctrl-C stops it.\n", flush=True)
    deadline = None if args.duration is None else time.monotonic() + args.duration
    stats = _LiveStats(clock)

    def on_tick(sim: Any, v: float) -> None:
        g, p = sim.take_samples()
        feed_rows(fake, uuids, g, p)

    def past_deadline() -> bool:
        return deadline is not None and time.monotonic() > deadline

    try:
        stream(
            scenario,
            ep.otlp_http or "",
            speed=args.speed,
            start_ns=clock.start_ns,
            on_tick=on_tick,
            gpu_names=uuids,
            on_requests=stats.add,
            stop=past_deadline,
        )
        if not past_deadline():
            clock.real_time()
            print(
                f"\nthe scenario has ended; the dashboard and API keep serving what was "
                f"recorded at {ep.api}/ — Ctrl-C to stop",
                flush=True,
            )
            # sleep, not runner.join(): a join that Ctrl-C interrupts can leave the thread
            # marked finished (CPython < 3.13), and the join after stop() would not wait
            while runner.is_alive() and not past_deadline():
                time.sleep(0.2)
    except KeyboardInterrupt:
        print("\nstopping…", flush=True)
    finally:
        service.stop()
        runner.join(60)
    print(
        f"\n{printer.count} incidents; store kept at {args.store} "
        f"(cotenant diagnose --store {args.store} --model …)"
    )
    return 0


class _LiveStats:
    """Prints ingested counts and live p99 per model every 30 virtual seconds."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._next = 30.0
        self._lat: dict[str, list[float]] = {}
        self.total = 0

    def add(self, cols: dict[str, list[Any]]) -> None:
        self.total += len(cols["model"])
        for m, lat in zip(cols["model"], cols["latency_ms"], strict=True):
            self._lat.setdefault(m, []).append(lat)
        v = self._clock.virtual_s(self._clock())
        if v >= self._next:
            parts = ", ".join(
                f"{m} {np.percentile(x, 99):.0f} ms" for m, x in sorted(self._lat.items()) if x
            )
            print(f"[{v:5.0f} s] {self.total} requests sent; p99 last 30 s: {parts}", flush=True)
            self._lat = {}
            self._next = v + 30.0


class _IncidentPrinter:
    """Tells each incident's story, one line per change, in the order the loop saw them:
    ``diagnosing`` -> ``INCIDENT … top cause`` -> ``cause changed`` -> ``resolved after N s``."""

    def __init__(self, clock: VirtualClock, out: TextIO | None = None) -> None:
        self._clock = clock
        self._out = out
        self._ids: set[str] = set()

    @property
    def count(self) -> int:
        return len(self._ids)

    def __call__(self, e: IncidentEvent) -> None:
        inc = e.incident
        if e.kind == "opened":  # transients withdrawn before publication do not count
            self._ids.add(inc.id)
        at = self._clock.virtual_s(e.at_ns)
        t0 = self._clock.virtual_s(inc.start_ns)
        who = f"{inc.model} on {inc.gpu}"
        slo = f" (SLO {inc.slo_ms:.0f} ms)" if inc.slo_ms else " (no SLO)"
        base = f"baseline {inc.baseline_p99_ms or 0:.0f} ms"
        lines: list[str] = []
        if e.kind == "diagnosing":
            lines.append(
                f"diagnosing {who}: {inc.severity}, p99 {inc.peak_p99_ms or 0:.0f} ms{slo}, "
                f"{base}, since {t0:.0f} s; finding the cause…"
            )
        elif e.kind in ("opened", "reopened"):
            head = "INCIDENT" if e.kind == "opened" else "INCIDENT again"
            lines.append(
                f"{head} {who} [{inc.severity}] since {t0:.0f} s: p99 {inc.peak_p99_ms or 0:.0f}"
                f" ms{slo}, {base} — top cause {_cause_text(inc.top)}"
            )
            lines += [f"          {i}. {_cause_line(c)}" for i, c in enumerate(_causes(inc), 1)]
        elif e.kind == "cause_changed":
            lines.append(
                f"cause changed {who}: {_cause_text(e.previous)} -> {_cause_text(inc.top)}"
            )
        elif e.kind == "escalated":
            lines.append(f"escalated {who}: now over its SLO{slo}, p99 {inc.peak_p99_ms:.0f} ms")
        elif e.kind == "dismissed":
            lines.append(f"transient {who}: over in seconds, not an incident")
        elif e.kind == "resolved":
            back = inc.resolved_p99_ms
            now = f"p99 back to {back:.0f} ms" if back is not None else "no longer slow"
            lines.append(
                f"resolved {who} after {(inc.end_ns - inc.start_ns) / 1e9:.0f} s ({now}; "
                f"peak {inc.peak_p99_ms or 0:.0f} ms{slo}) — {_cause_text(inc.top)}"
            )
        out = self._out or sys.stdout
        for i, line in enumerate(lines):
            out.write((f"[{at:5.0f} s] " if i == 0 else "") + line + "\n")
        out.flush()


def _causes(inc: Incident) -> list[Cause]:
    return inc.causes[:3]


def _cause_text(c: Cause | None) -> str:
    if c is None:
        return str(CauseKind.UNKNOWN)
    res = f" ({c.resource})" if c.resource else ""
    return f"{c.kind} {c.culprit}{res} {c.share * 100:.0f}%"


def _cause_line(c: Cause) -> str:
    res = f" ({c.resource})" if c.resource else ""
    return (
        f"{c.kind} {c.culprit}{res}: {c.share * 100:.0f}% of the excess, "
        f"confidence {c.confidence:.2f}"
    )

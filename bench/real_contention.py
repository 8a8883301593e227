"""Real contention on this machine's CPUs, diagnosed by a real ``cotenant serve``.

Run ``.venv/bin/python bench/real_contention.py`` (``--quick`` for one short run of each
situation; ``--help`` for the rest). Each run starts ``cotenant serve`` as a subprocess on free
loopback ports (NVML off, dashboard and actuators off, ``[procfs] enabled`` on or off) and
three model servers (``bench/contention_workers.py``, plain OpenTelemetry SDK, our span shape,
all on ``cotenant.gpu = gpu0``) that run for the whole run:

* ``tts`` — the latency-sensitive victim: Poisson 40 requests/s of ~1.5 ms;
* ``imagegen`` — 0.2 requests/s of ~60 ms;
* ``ocr`` — a bystander whose demand never changes: 5 requests/s of ~4 ms.

Then, ``--fault-at`` seconds in and for ``--fault-s`` seconds, one of the situations:

* ``silent`` — ``strength x nproc`` CPU burners that emit no spans. Truth: with procfs on, a
  ``cpu`` cause naming the burners; with procfs off, ``unknown``. Never imagegen or ocr.
* ``visible`` — ``strength`` extra imagegen servers serving back to back: imagegen's own load
  rises. Truth: imagegen (``cotenant`` or ``cpu``). Never ocr; imagegen's own incident never
  blames tts or ocr.
* ``control`` — nothing. Truth: no incident.

After the run (and two analysis intervals for the loop to catch up) the incidents are read
through ``GET /api/v1/incidents``, serve is stopped, and tts's p99 before and during the
fault is read from the store. One line per run says what was found against the truth (whether
the first tts incident of the fault names it, whether every one does, how many there were, any
bystander blamed, incidents outside the fault); with ``--json FILE`` everything is written
there too, and ``--rescore FILE`` scores saved runs again. Every loop is bounded in count and
time and every process is stopped at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import httpx  # noqa: E402
from conftest import Served, start_serve  # noqa: E402

from cotenant.collectors.procfs.collector import program_name  # noqa: E402
from cotenant.store.db import Store  # noqa: E402

WORKERS = ROOT / "bench" / "contention_workers.py"
MODELS = {"tts": (40.0, 1.5), "imagegen": (0.2, 60.0), "ocr": (5.0, 4.0)}  # rate, work ms
BYSTANDERS = {"silent": {"imagegen", "ocr"}, "visible": {"ocr"}, "control": set()}
SETTLE_S = 30.0  # an incident may end this long after its fault
CATCH_UP_S = 12.0  # two analysis intervals (5 s) and the ingest lag


@dataclass
class Run:
    situation: str
    strength: int
    procfs: bool
    seed: int
    tts_p99_before_ms: float | None = None
    tts_p99_during_ms: float | None = None
    culprit_name: str | None = None  # the burners' process name, as procfs records it
    incidents: list[dict[str, Any]] = field(default_factory=list)
    verdict: str = ""
    first_ok: bool = False  # the first tts incident of the fault names the truth
    correct: bool = False  # every tts incident of the fault does, and no bystander is blamed
    tts_incidents: int = 0  # tts incidents overlapping the fault
    bystander_blamed: bool = False
    false_incidents: int = 0


def top(inc: dict[str, Any]) -> tuple[str, str] | None:
    """The incident's top named cause, (kind, culprit); None when it is all unknown."""
    for c in inc.get("causes") or []:
        if c.get("kind") != "unknown":
            return str(c["kind"]), str(c["culprit"])
    if inc.get("top_cause") and inc["top_cause"] != "unknown":
        return str(inc["top_cause"]), str(inc.get("top_culprit"))
    return None


def spawn(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(WORKERS), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )


def model(name: str, seconds: float, otlp: str, seed: int, rate: float | None = None) -> list[str]:
    r, work = MODELS[name]
    return [
        "model", "--name", name, "--rate", str(r if rate is None else rate), "--work-ms",
        str(work), "--seconds", str(seconds), "--otlp", otlp, "--seed", str(seed),
    ]  # fmt: skip


def stop_all(procs: list[subprocess.Popen[bytes]], timeout_s: float = 20.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


def one_run(run: Run, a: argparse.Namespace, tmp: Path) -> Run:
    env = {
        "COTENANT_SERVER_HOST": "127.0.0.1",
        "COTENANT_OTLP_HOST": "127.0.0.1",
        "COTENANT_OTLP_GRPC_ENABLED": "false",
        "COTENANT_NVML_ENABLED": "false",
        "COTENANT_PROCFS_ENABLED": "true" if run.procfs else "false",
        "COTENANT_DASHBOARD_ENABLED": "false",
        "COTENANT_ACTUATORS_MODE": "off",
    }
    store = tmp / f"run-{run.seed}.duckdb"
    served: Served | None = None
    procs: list[subprocess.Popen[bytes]] = []
    t0_ns = time.time_ns()
    try:
        served = start_serve(tmp, store, env)
        t0, t0_ns = time.monotonic(), time.time_ns()
        for k, name in enumerate(MODELS):
            procs.append(spawn(model(name, a.duration, served.otlp_http, run.seed * 10 + k)))
        sleep_until(t0 + a.fault_at)
        fault: list[subprocess.Popen[bytes]] = []
        if run.situation == "silent":
            n = run.strength * (os.cpu_count() or 1)
            fault = [spawn(["burn", "--seconds", str(a.fault_s)]) for _ in range(n)]
            run.culprit_name = _name_of(fault[0].pid)
        elif run.situation == "visible":
            fault = [
                spawn(model("imagegen", a.fault_s, served.otlp_http, run.seed * 10 + 5 + i, 0.0))
                for i in range(run.strength)
            ]
        procs += fault
        sleep_until(t0 + a.fault_at + a.fault_s)
        stop_all(fault, 10.0)
        sleep_until(t0 + a.duration + 5)  # the servers flush their last spans
        stop_all(procs, 20.0)
        time.sleep(CATCH_UP_S)  # the analysis loop catches up with the last windows
        r = httpx.get(f"{served.api}/api/v1/incidents", params={"limit": 200}, timeout=30)
        r.raise_for_status()
        run.incidents = [_brief(i, t0_ns) for i in r.json()["incidents"]]
    finally:
        stop_all(procs, 5.0)
        if served is not None:
            served.stop()
    run.tts_p99_before_ms, run.tts_p99_during_ms = _tts_p99(store, t0_ns, a)
    return score(run, a)


def _name_of(pid: int) -> str:
    """The name procfs gives a burner (its comm and script), read once it has started."""
    for _ in range(50):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if cmdline.count(b"\0") > 1:
                return program_name(comm, cmdline)
        except OSError:
            pass
        time.sleep(0.02)
    return "?"


def _brief(inc: dict[str, Any], t0_ns: int) -> dict[str, Any]:
    causes = [
        {
            **{k: c.get(k) for k in ("kind", "culprit", "share", "confidence")},
            "demand_rose": (c.get("evidence") or {}).get("demand_rose"),
            # a host process's cores before/during say why it was named over another
            **({"evidence": c.get("evidence")} if c.get("kind") == "cpu" else {}),
        }
        for c in inc.get("causes") or []
    ]
    unknown = next((c for c in inc.get("causes") or [] if c.get("kind") == "unknown"), {})
    return {
        "model": inc["model"],
        "start_s": round((inc["start_ns"] - t0_ns) / 1e9, 1),
        "end_s": round((inc["end_ns"] - t0_ns) / 1e9, 1) if inc.get("end_ns") else None,
        "state": inc.get("state"),
        "severity": inc.get("severity"),
        "peak_p99_ms": inc.get("peak_p99_ms"),
        "baseline_p99_ms": inc.get("baseline_p99_ms"),
        "top": top(inc),
        "causes": causes,
        "contention": (unknown.get("evidence") or {}).get("contention"),
        "notes": inc.get("notes", []),
        "cause_history": inc.get("cause_history"),
    }


def _tts_p99(store: Path, t0_ns: int, a: argparse.Namespace) -> tuple[float | None, float | None]:
    """tts's p99 (ms) over the minute before the fault and over the fault."""
    f0 = t0_ns + int(a.fault_at * 1e9)
    f1 = f0 + int(a.fault_s * 1e9)
    out: list[float | None] = []
    with Store(store, read_only=True) as s, s.cursor() as cur:
        for lo, hi in ((f0 - 60_000_000_000, f0), (f0, f1)):
            row = cur.execute(
                "SELECT quantile_cont(latency_ms, 0.99) FROM requests "
                "WHERE model = 'tts' AND ts_end_ns >= ? AND ts_end_ns < ?",
                [lo, hi],
            ).fetchone()
            out.append(None if row is None or row[0] is None else round(float(row[0]), 2))
    return out[0], out[1]


def score(run: Run, a: argparse.Namespace) -> Run:
    lo, hi = a.fault_at, a.fault_at + a.fault_s + SETTLE_S
    during = [i for i in run.incidents if i["start_s"] < hi and (i["end_s"] or a.duration) > lo]
    if run.situation == "control":
        during = []
    run.false_incidents = len(run.incidents) - len(during)
    bystanders = BYSTANDERS[run.situation]
    blamed = [i for i in during if i["top"] and i["top"][1] in bystanders]
    if run.situation == "visible":  # imagegen's own incident must not blame the others
        blamed += [i for i in during if i["model"] == "imagegen" and i["top"]
                   and i["top"][1] in ("tts", "ocr")]  # fmt: skip
    run.bystander_blamed = bool(blamed)
    victim = sorted((i for i in during if i["model"] == "tts"), key=lambda i: i["start_s"])
    run.tts_incidents = len(victim)
    tops = [_top(i) for i in victim]
    if run.situation == "control":
        run.correct = run.first_ok = not run.incidents
        run.verdict = f"{len(run.incidents)} incidents"
        return run
    if not victim:
        run.verdict = "missed: no tts incident (detection)"
        return run
    if run.situation == "silent":
        want = ("cpu", run.culprit_name) if run.procfs else None
        hits = [t == want for t in tops]
    else:
        hits = [t is not None and t[1] == "imagegen" for t in tops]
    run.first_ok = hits[0] and not run.bystander_blamed
    run.correct = all(hits) and not run.bystander_blamed
    run.verdict = ", ".join(_fmt(t) for t in tops)
    return run


def _top(inc: dict[str, Any]) -> tuple[str, str] | None:
    t = inc.get("top")
    return None if t is None else (str(t[0]), str(t[1]))


def _fmt(t: tuple[str, str] | None) -> str:
    return "unknown" if t is None else f"{t[0]}:{t[1]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--situations", default="silent,visible,control")
    ap.add_argument("--procfs", choices=("on", "off", "both"), default="both",
                    help="silent runs with procfs on, off or both (others: on)")  # fmt: skip
    ap.add_argument("--strengths", default="",
                    help="comma list (silent: burners per core; visible: extra imagegen "
                         "servers); default silent 1,2 and visible 1,2")  # fmt: skip
    ap.add_argument("--runs", type=int, default=1, help="repeats of each combination")
    ap.add_argument("--duration", type=float, default=240.0, help="seconds per run")
    ap.add_argument("--fault-at", type=float, default=120.0)
    ap.add_argument("--fault-s", type=float, default=60.0)
    ap.add_argument("--quick", action="store_true",
                    help="150 s runs (fault 90-135 s), one strength per situation")  # fmt: skip
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--keep", type=Path, metavar="DIR", help="keep each run's store and serve log in DIR"
    )
    ap.add_argument("--rescore", type=Path, nargs="+", metavar="JSON",
                    help="score runs saved by --json again instead of running")  # fmt: skip
    a = ap.parse_args(argv)
    if a.quick:
        a.duration, a.fault_at, a.fault_s = 150.0, 90.0, 45.0
    if a.rescore:
        return rescore(a.rescore, a)
    if not 0 < a.fault_at < a.fault_at + a.fault_s <= a.duration <= 3600 or a.runs > 20:
        ap.error("need 0 < fault_at < fault_at + fault_s <= duration <= 3600 and runs <= 20")
    plan: list[Run] = []
    seed = a.seed
    for sit in a.situations.split(","):
        if sit not in BYSTANDERS:
            ap.error(f"unknown situation {sit!r}")
        if a.strengths:
            strengths = [int(x) for x in a.strengths.split(",")]
        else:
            strengths = {"silent": [2] if a.quick else [1, 2],
                         "visible": [2] if a.quick else [1, 2]}.get(sit, [0])  # fmt: skip
        modes = {"on": [True], "off": [False], "both": [True, False]}[a.procfs]
        for _ in range(a.runs):
            for st in strengths:
                for pf in modes if sit == "silent" else [True]:
                    plan.append(Run(sit, st, pf, seed))
                    seed += 1
    print(f"{len(plan)} runs of {a.duration:g} s on {os.cpu_count()} CPUs", flush=True)
    results = []
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="cotenant-contention-") as d:
        where = Path(d) if a.keep is None else a.keep
        where.mkdir(parents=True, exist_ok=True)
        for run in plan:
            one_run(run, a, where)
            results.append(run)
            print(line(run), flush=True)
    print(totals(results))
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


HEADER = (
    f"{'situation':9} {'str':>3} {'procfs':6} {'tts p99 ms':>16}  {'first':5} {'all':3} "
    f"{'n':>2} {'bystander':9} {'false':>5}  found (tts incidents during the fault, in order)"
)


def line(run: Run) -> str:
    p99 = f"{run.tts_p99_before_ms}->{run.tts_p99_during_ms}"
    return (
        f"{run.situation:9} {run.strength:>3} {'on' if run.procfs else 'off':6} {p99:>16}  "
        f"{'yes' if run.first_ok else 'NO':5} {'yes' if run.correct else 'NO':3} "
        f"{run.tts_incidents:>2} {'BLAMED' if run.bystander_blamed else 'no':9} "
        f"{run.false_incidents:>5}  {run.verdict}"
    )


def totals(results: list[Run]) -> str:
    n = len(results)
    return (
        f"first incident right {sum(r.first_ok for r in results)}/{n}; every incident right "
        f"{sum(r.correct for r in results)}/{n}; bystander blamed in "
        f"{sum(r.bystander_blamed for r in results)}/{n}"
    )


def rescore(paths: list[Path], a: argparse.Namespace) -> int:
    """Score the runs saved with ``--json`` again (with these timing options) and print them."""
    names = {f.name for f in fields(Run)}
    results = []
    print(HEADER)
    for p in paths:
        for raw in json.loads(p.read_text()):
            run = score(Run(**{k: v for k, v in raw.items() if k in names}), a)
            results.append(run)
            print(line(run))
    print(totals(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

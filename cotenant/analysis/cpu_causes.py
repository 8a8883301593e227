"""Host CPU causes: processes whose CPU use rose, and a host whose CPU frequency fell.

**Risers.** Host CPU use (cores, from ``process_samples.cpu_cores``: procfs for real hosts, the
simulator's host rows) counts CPU seconds actually run, so unlike a GPU's busy time it does not
inflate when a process is merely slowed: a rise is more work. Two exceptions are left to the
caller: the victim itself, and co-tenant models whose demand did not rise (a runtime that
spin-waits on a slow GPU burns CPU as a symptom); both are passed in ``exclude``. A rise counts
when the during mean is at least :data:`MIN_RISE_CORES` over the before mean and
:data:`MIN_Z` standard errors of the difference of the two means (Welch), so the jitter of
idle processes names nobody, while a before range that straddles the start of a hog (a
re-opened incident) still shows its rise.

**Frequency.** Where procfs read cpufreq (``process_samples.cpu_freq_mhz`` and
``cpu_max_freq_mhz``: the host's mean current and hardware-maximum frequency), a clamp shows as
the ratio of the two falling between the normal and the slow windows (a one-sided Welch test,
:mod:`analysis.enrichment`, and at least :data:`FREQ_DROP`). CPU-bound time stretches by
``f_before / f_during``, so the clamp predicts ``time_before x (f_before / f_during - 1)`` of
the host phases (preprocess, postprocess) and, after the GPU-side explanations, of the compute
spans (which hold host work too: scheduling, kernel launches). Its culprit is ``host``.

:class:`CpuExplainer` makes both claims; :func:`read_host_cpu` reads the series from a source.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from cotenant.analysis.apportion import TRUST
from cotenant.analysis.candidates import Candidate
from cotenant.analysis.change import absent_as_zero, mean_over, strength
from cotenant.analysis.change import evidence as change_evidence
from cotenant.analysis.claims import Claim, Context, Phase, Stage
from cotenant.analysis.enrichment import shift_enrichment
from cotenant.analysis.host_cpu import CpuRiser, HostCpu, HostFrequency
from cotenant.analysis.metric_direction import Direction
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.readers import MetricSource
from cotenant.core.timerange import TimeRange

MIN_RISE_CORES = 0.05
MIN_Z = 3.0
SE_FLOOR = 0.01
"""Cores: the standard error of a flat series is taken as at least this."""
FREQ_DROP = 1.05
"""Frequency ratio before over during above this: the host's CPUs slowed."""
FREQ_SE = 0.01
"""Frequency ratio (0-1): the least standard error of its fall."""
HOST = "host"
"""The culprit of a CPU cause no process explains (a clamped frequency, a saturated host)."""


def unsampled_as_idle(host_cpu: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """``host_cpu`` (name -> cores per window) with each process's missing windows set to 0
    where the sampler ran (some process was sampled there): a process missing from a sample
    was below the sampler's floor or not running yet. A burner that started a little before
    the slowdown shows as the rise it is, not as its own level before and during."""
    series = {k: np.asarray(x, dtype=np.float64) for k, x in (host_cpu or {}).items()}
    if not series:
        return series
    sampled = np.zeros(len(next(iter(series.values()))), dtype=bool)
    for x in series.values():
        sampled |= np.isfinite(x)
    return {k: np.where(sampled & ~np.isfinite(x), 0.0, x) for k, x in series.items()}


def cpu_risers(
    host_cpu: Mapping[str, np.ndarray] | None,
    before: np.ndarray,
    during: np.ndarray,
    exclude: Collection[str] = (),
) -> list[CpuRiser]:
    """Processes of ``host_cpu`` (name -> cores per window) whose CPU use rose, largest rise
    first; names in ``exclude`` are skipped. A process almost never sampled before the
    incident (e.g. outside a top-N) counts as idle then."""
    out = []
    for name, x in unsampled_as_idle(host_cpu).items():
        if name in exclude:
            continue
        y = absent_as_zero(x, before)
        b, d = mean_over(y, before), mean_over(y, during)
        if not (np.isfinite(b) and np.isfinite(d)) or d - b < MIN_RISE_CORES:
            continue
        yb, yd = y[before], y[during]
        nb, nd = max(int(np.isfinite(yb).sum()), 1), max(int(np.isfinite(yd).sum()), 1)
        se = float(np.sqrt(np.nanvar(yb) / nb + np.nanvar(yd) / nd))
        z = (d - b) / max(se, SE_FLOOR)
        if z < MIN_Z:
            continue
        out.append(CpuRiser(name, b, d, z))
    out.sort(key=lambda r: -r.rise)
    return out


@dataclass(frozen=True)
class FrequencyDrop:
    """How far the host's CPU frequency fell: ``slowdown`` = ratio before / during (> 1)."""

    slowdown: float
    confidence: float
    evidence: dict[str, Any]


def frequency_drop(
    freq: HostFrequency | None, before: np.ndarray, during: np.ndarray
) -> FrequencyDrop | None:
    """The host's CPU frequency fell from ``before`` to ``during`` beyond its spread, or None."""
    if freq is None:
        return None
    ratio = freq.ratio
    test = shift_enrichment(ratio, before, during, Direction.FALL, se_floor=FREQ_SE)
    rb, rd = test.before, test.during
    if not (test.named and np.isfinite(rb) and np.isfinite(rd) and rd > 0 and rb / rd > FREQ_DROP):
        return None
    ev: dict[str, Any] = {
        "series": "host CPU frequency",
        "unit": "MHz",
        "before": _r(mean_over(freq.mhz, before)),
        "during": _r(mean_over(freq.mhz, during)),
        "max_mhz": _r(mean_over(freq.max_mhz, before | during)),
        "of_max": {"before": _r(rb), "during": _r(rd)},
        "enrichment": test.to_evidence(),
    }
    return FrequencyDrop(rb / rd, strength(test.z), ev)


def cpu_candidate(name: str, victim: str) -> Candidate:
    """The cause a rise in ``name``'s host CPU use points at: the victim's own ``load`` when it
    is the victim (its arrivals surged), else ``cpu``."""
    return Candidate(CauseKind.LOAD, victim) if name == victim else Candidate(CauseKind.CPU, name)


def _riser_evidence(ctx: Context, top: CpuRiser) -> tuple[float, dict[str, Any]]:
    # the series the rise was tested on (:func:`cpu_risers`), so the evidence shows that rise
    series = absent_as_zero(unsampled_as_idle(ctx.host_cpu)[top.name], ctx.before)
    ev = change_evidence(series, ctx.before, ctx.during, f"{top.name} host CPU", "cores")
    if len(ctx.risers) > 1:
        ev["also_rose"] = [
            {"process": r.name, "before": round(r.before, 3), "during": round(r.during, 3)}
            for r in ctx.risers[1:6]
        ]
    # as strong as the test that named it (a Welch z over the same series): a robust measure
    # of the before windows' spread reads a burner that began inside them as no rise at all
    return strength(top.z), ev


@dataclass(frozen=True)
class CpuExplainer:
    kind: CauseKind = CauseKind.CPU

    def claims(self, ctx: Context) -> list[Claim]:
        top = ctx.risers[0] if ctx.risers else None
        drop = frequency_drop(ctx.frequency, ctx.before, ctx.during)
        host = Candidate(CauseKind.CPU, HOST)
        out = []
        if ctx.excess.get(Phase.COMPUTE, 0.0) > 0:
            if top is not None:
                conf, ev = _riser_evidence(ctx, top)
                ms = TRUST * ctx.compute_before * top.rise
                cand = cpu_candidate(top.name, ctx.victim)
                out.append(Claim(cand, Phase.COMPUTE, Stage.RESIDUAL, ms, conf, ev))
            if drop is not None:
                ms = ctx.compute_before * (drop.slowdown - 1)
                out.append(
                    Claim(host, Phase.COMPUTE, Stage.RESIDUAL, ms, drop.confidence, drop.evidence)
                )
        cpu_ms = ctx.excess.get(Phase.CPU, 0.0)
        if cpu_ms > 0:
            if top is not None:
                conf, ev = _riser_evidence(ctx, top)
                cand = cpu_candidate(top.name, ctx.victim)
                out.append(Claim(cand, Phase.CPU, Stage.FIRST, np.inf, conf, ev))
            elif drop is not None:
                out.append(
                    Claim(host, Phase.CPU, Stage.FIRST, np.inf, drop.confidence, drop.evidence)
                )
            else:
                ev = change_evidence(None, ctx.before, ctx.during, f"{ctx.victim} preprocess", "")
                out.append(Claim(host, Phase.CPU, Stage.FIRST, np.inf, 0.2, ev))
                if cpu_ms >= 0.01 * ctx.total:
                    ctx.notes.append("preprocess grew but no host CPU series names a culprit")
        return out


def read_host_cpu(
    source: MetricSource,
    rng: TimeRange,
    step_s: float,
    n: int,
    hosts: Collection[str] = (),
) -> HostCpu:
    """Host CPU use (cores) per process name on the window grid of ``rng``, and the host's CPU
    frequency where it was read: the processes sharing a name (eight ``python`` burners) are
    summed, each (host, pid) counted once however many GPUs it has rows on. Only rows of
    ``hosts`` when given (a fleet's source holds every node's processes: a CPU hog on another
    node cannot slow this GPU's models)."""
    t = source.process_windows(rng, step_s, hosts=sorted(hosts) if hosts else None)
    if t.num_rows == 0:
        return HostCpu()
    since = rng.since_ns or 0
    idx = (t.column("ts_ns").to_numpy() - since) // int(step_s * 1e9)
    inside = (idx >= 0) & (idx < n)
    frequency = _frequency(t, idx, inside, n)
    cpu = np.asarray(t.column("cpu_cores").to_numpy(zero_copy_only=False), dtype=np.float64)
    ok = np.isfinite(cpu) & inside
    if not ok.any():
        return HostCpu(frequency=frequency)
    names = t.column("process_name").to_pylist()
    pids = t.column("pid").to_pylist()
    rows = pd.DataFrame(
        {
            "w": idx[ok],
            "host": [h or "" for h in np.asarray(t.column("host").to_pylist(), dtype=object)[ok]],
            "pid": np.asarray(pids, dtype=object)[ok],
            "name": [nm or f"pid {p}" for nm, p, keep in zip(names, pids, ok, strict=True) if keep],
            "cpu": cpu[ok],
        }
    )
    # one process on two GPUs has a row per GPU with the same host CPU: count it once
    per_pid = rows.groupby(["w", "host", "pid"], sort=False, dropna=False).agg(
        name=("name", "first"), cpu=("cpu", "max")
    )
    per_name = per_pid.groupby(["name", "w"], sort=False)["cpu"].sum()
    out = HostCpu(frequency=frequency)
    for name, series in per_name.groupby(level=0, sort=True):
        arr = np.full(n, np.nan)
        arr[series.index.get_level_values(1).to_numpy()] = series.to_numpy()
        out[str(name)] = arr
    return out


def _frequency(t: Any, idx: np.ndarray, inside: np.ndarray, n: int) -> HostFrequency | None:
    """Per window the mean of the rows' CPU frequency and maximum, when the table has them."""
    if "cpu_freq_mhz" not in t.column_names or "cpu_max_freq_mhz" not in t.column_names:
        return None
    cols = []
    for name in ("cpu_freq_mhz", "cpu_max_freq_mhz"):
        x = np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)
        ok = inside & np.isfinite(x)
        s = np.bincount(idx[ok], weights=x[ok], minlength=n)[:n]
        c = np.bincount(idx[ok], minlength=n)[:n]
        with np.errstate(invalid="ignore", divide="ignore"):
            cols.append(np.where(c > 0, s / np.maximum(c, 1), np.nan))
    if not np.isfinite(cols[0]).any():
        return None
    return HostFrequency(cols[0], cols[1])


def _r(x: float) -> float | None:
    return round(float(x), 1) if np.isfinite(x) else None

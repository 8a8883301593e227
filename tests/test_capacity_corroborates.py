"""A weak slowdown whose cause is a capacity the GPU lost is an incident.

Seen on the development population (dev 36): a GPU's clock is cut from 1,410 to about 1,225
MHz for 160 s under two LLMs; the one at 17 requests/s (Azure trace arrivals) slows 1.45x at
its p99, but its own variation is wide and its slowdown reaches only the evidence asked of a
fellow victim, and the other victim (0.1 requests/s) had no incident to corroborate it: never
found. A clock that fell while busy, or memory grown into a full GPU, corroborates a weak
slowdown as another victim's incident would: ordinary traffic never causes them, so fault-free
controls cannot raise one this way.
"""

from __future__ import annotations

from diagnoses import diagnosis

from cotenant.analysis.attribution import Cause
from cotenant.analysis.detector.normal import Normal
from cotenant.analysis.detector.verdicts import verdict
from cotenant.analysis.diagnosis import NEWS, Judged
from cotenant.evaluation.population_bench import Job, run_job

NORMAL = Normal(2.0, 0.01, 0.0, tuple(range(-6, 7)), 1.0, (1.0,) * 4, 1.0, 600)


def test_a_throttled_llm_with_a_weak_slowdown_is_found_as_the_throttle() -> None:
    r = run_job(Job("dev", "faulted", 36))
    assert r.error is None
    [v] = [v for v in r.victims if v.victim == "llm-1" and v.fault_kind == "throttle"]
    assert v.found and v.final_cause == "throttle:gpu1", v


def _weak(cause: Cause) -> str | None:
    d = diagnosis("chat", "degradation", [cause, Cause("unknown", "—", 0.3, 0.0, {})], 100, 160)
    d.judged = Judged("typical", 2.0, 1.0, NORMAL, False, 1.4)
    return verdict(d, [])


def test_only_a_lost_capacity_corroborates_a_weak_slowdown_on_its_own() -> None:
    assert _weak(Cause("throttle", "gpu0", 0.7, 0.9, {})) == NEWS
    assert _weak(Cause("memory", "trainer", 0.6, 0.9, {})) == NEWS
    # a neighbour's burst happens in ordinary traffic: it needs another victim's incident
    assert _weak(Cause("cotenant", "burster", 0.7, 0.9, {})) is None
    # a clock that explains little of the slowdown is no corroboration
    assert _weak(Cause("throttle", "gpu0", 0.3, 0.9, {})) is None

"""A steady model's own traffic surge that lasts is an incident; a bursty one's bursts are not.

Seen on the development population (dev 161): an image model at 1.2 requests/s (Poisson) gets
2.7x its traffic for 103 s; its queue takes it to 22x its p99, over its SLO for three minutes,
and nothing was raised: its first cause was its own load, which was always ordinary contention
(so that bursty tenants are not paged for their own bursts). What tells the two apart is the
traffic before: a surge held for a minute by a model whose rate never swung beyond Poisson
noise is a change in its demand; a bursty or trace-shaped tenant's swings are its ordinary.
"""

from __future__ import annotations

import numpy as np
from diagnoses import diagnosis

from cotenant.analysis.attribution import Cause
from cotenant.analysis.demand import arrival_swing, surge_s
from cotenant.analysis.detector.verdicts import verdict
from cotenant.analysis.diagnosis import NEWS, OWN_LOAD
from cotenant.evaluation.population_bench import Job, run_job

STEP = 1_000_000_000


def _windows(arrivals: np.ndarray, lo: int, hi: int) -> tuple[dict, np.ndarray, np.ndarray]:
    before = np.zeros(len(arrivals), dtype=bool)
    before[max(0, lo - 60) : lo] = True
    during = np.zeros(len(arrivals), dtype=bool)
    during[lo:hi] = True
    return {"arrival_rps": arrivals, "count": arrivals}, before, during


def test_a_steady_models_surge_is_long_and_its_traffic_did_not_swing() -> None:
    rng = np.random.default_rng(1)
    steady = rng.poisson(2.0, 900).astype(float)
    steady[600:720] = rng.poisson(4.0, 120)  # twice its traffic for two minutes
    v, before, during = _windows(steady, 600, 780)  # slow until its queue drained
    assert 100 <= surge_s(v, before, during, STEP) <= 130
    assert arrival_swing(v, during, STEP) < 0.1
    # the same at 200 requests/s: how much the rate swings does not grow with the rate
    v, before, during = _windows(rng.poisson(200.0, 900).astype(float), 600, 780)
    assert arrival_swing(v, during, STEP) < 0.1


def test_a_bursty_models_burst_is_short_and_its_traffic_swung() -> None:
    rng = np.random.default_rng(2)
    bursty = rng.poisson(2.0, 900).astype(float)
    for at in (100, 250, 420, 600):  # 20-s bursts at 8x, minutes apart
        bursty[at : at + 20] = rng.poisson(16.0, 20)
    v, before, during = _windows(bursty, 600, 660)
    assert surge_s(v, before, during, STEP) < 60
    assert arrival_swing(v, during, STEP) > 1.0
    # too little history to say how it swings (half a minute): unknown, and so no news
    v, before, during = _windows(bursty, 30, 60)
    assert np.isnan(arrival_swing(v, during, STEP))


def _own(evidence: dict) -> str | None:
    d = diagnosis("vision", "breach", [Cause("load", "vision", 1.0, 0.9, evidence)], 300, 460)
    return verdict(d, [])


def test_a_held_surge_after_steady_traffic_is_news_and_anything_else_its_own_load() -> None:
    assert _own({"surge_s": 110.0, "swing": 0.0}) == NEWS
    assert _own({"surge_s": 40.0, "swing": 0.0}) == OWN_LOAD  # a burst
    assert _own({"surge_s": 185.0, "swing": 7.0}) == OWN_LOAD  # a trace's swing
    assert _own({"surge_s": 185.0}) == OWN_LOAD  # how it swung is not known
    assert _own({}) == OWN_LOAD


def test_the_image_models_own_surge_is_found_naming_its_load() -> None:
    r = run_job(Job("dev", "faulted", 161))
    assert r.error is None
    [v] = [v for v in r.victims if v.victim == "vision-0"]
    assert v.found and v.final_cause == "load:vision-0", v

"""Attribution as one explainer per cause kind: the registry, the apportioning, direction-aware
and base-rate-aware evidence, the victim's own heavier work for any model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from analysis_frames import FAULT, N, masks, slow_compute, windows

from cotenant.actuators import policy
from cotenant.analysis.apportion import TRUST, apportion
from cotenant.analysis.attribution import attribute
from cotenant.analysis.candidates import Candidate
from cotenant.analysis.claims import Claim, Context, Phase, Stage
from cotenant.analysis.enrichment import Z_NAMED, rate_enrichment, shift_enrichment
from cotenant.analysis.explainers import EXPLAINERS
from cotenant.analysis.metric_direction import Direction
from cotenant.analysis.mix import WorkSeries
from cotenant.analysis.windows import TOKEN_FIELDS
from cotenant.core.cause_kinds import CAUSE_KINDS, CauseKind, cause_kind


def named(att):  # type: ignore[no-untyped-def]
    return [(str(c.kind), c.culprit) for c in att.causes if c.kind != CauseKind.UNKNOWN]


def test_every_cause_kind_but_unknown_has_one_explainer_and_the_policy_shares_the_registry() -> (
    None
):
    assert set(EXPLAINERS) == set(CauseKind) - {CauseKind.UNKNOWN}
    assert all(e.kind == k for k, e in EXPLAINERS.items())
    assert set(policy.load_policy().rules) == set(CAUSE_KINDS) and CAUSE_KINDS[-1] == "unknown"
    assert CauseKind.THROTTLE == "throttle" and cause_kind("mix") is CauseKind.MIX
    with pytest.raises(ValueError, match="'heat' is not a cause kind"):
        cause_kind("heat")


@dataclass(frozen=True)
class _Fixed:
    """An explainer that claims a fixed part of the compute excess."""

    ms: float
    kind: CauseKind = CauseKind.COTENANT

    def claims(self, ctx: Context) -> list[Claim]:
        cand = Candidate(CauseKind.COTENANT, "ghost")
        return [Claim(cand, Phase.COMPUTE, Stage.SHARED, self.ms, 0.9, {"why": "test"})]


def test_the_attribution_runs_whatever_explainers_it_is_given() -> None:
    w = windows()
    slow_compute(w)  # +10 ms of compute per request
    att = attribute(w, "tts", *masks(), explainers={CauseKind.COTENANT: _Fixed(2.0)})
    ghost = att.causes[0]
    assert (ghost.kind, ghost.culprit) == ("cotenant", "ghost")
    assert ghost.excess_ms == pytest.approx(TRUST * 2.0)  # trusted within a factor of two
    assert ghost.evidence == {"why": "test"}
    assert att.causes[-1].kind == "unknown"
    assert sum(c.share for c in att.causes) == pytest.approx(1.0)


def _claim(name: str, phase: Phase, stage: Stage, ms: float, **kw: object) -> Claim:
    return Claim(Candidate(CauseKind.COTENANT, name), phase, stage, ms, **kw)  # type: ignore[arg-type]


def test_apportioning_serves_stages_in_order_and_lost_capacity_follows_compute() -> None:
    claims = [
        _claim("first", Phase.COMPUTE, Stage.FIRST, 2.0),
        _claim("a", Phase.COMPUTE, Stage.SHARED, 1.0),
        _claim("b", Phase.COMPUTE, Stage.SHARED, 3.0),
        _claim("rest", Phase.COMPUTE, Stage.RESIDUAL, 100.0),
        Claim(None, Phase.QUEUE, Stage.FIRST, 4.0),
        _claim("own", Phase.QUEUE, Stage.FIRST, 1.0),
    ]
    got = apportion({Phase.COMPUTE: 20.0, Phase.QUEUE: 6.0}, claims)
    ms = {c.culprit: round(v, 6) for c, v in got.ms.items()}
    # compute: 2 first; a and b share min(18, 2 x 4) = 8 as 1:3; the residual takes the 10 left
    # queue: own takes 1, then 4 of lost capacity follows compute as 2:2:6:10 of 20; 1 unexplained
    assert ms == {"first": 2.4, "a": 2.4, "b": 7.2, "rest": 12.0, "own": 1.0}
    assert got.unexplained == {Phase.QUEUE: pytest.approx(1.0)}


def test_an_alone_claim_counts_only_when_no_other_actor_explains_anything() -> None:
    mine = Claim(Candidate(CauseKind.MIX, "v"), Phase.COMPUTE, Stage.LEFTOVER, 5.0, alone=True)
    own_loads = Claim(Candidate(CauseKind.MODEL_LOAD, "v"), Phase.OTHER, Stage.FIRST, np.inf)
    lock = Claim(Candidate(CauseKind.LOCK, "idx"), Phase.LOCK, Stage.FIRST, np.inf)
    excess = {Phase.COMPUTE: 5.0, Phase.OTHER: 1.0, Phase.LOCK: 1.0}
    with_lock = apportion(excess, [mine, own_loads, lock], "v")
    assert {c.kind for c in with_lock.ms} == {"model_load", "lock"}
    without = apportion(excess, [mine, own_loads], "v")
    assert {c.kind for c in without.ms} == {"model_load", "mix"}


def test_enrichment_tests_are_one_sided_against_the_normal_rate() -> None:
    before, during = np.zeros(100, bool), np.zeros(100, bool)
    before[:80], during[80:] = True, True
    common = np.ones(100)  # present in every window: explains nothing
    assert not rate_enrichment(common, before, during).named
    rare = np.zeros(100)
    rare[::10] = 1.0  # 1 in 10 normally
    rare[80:95] = 1.0  # 15 of the 20 slow windows
    e = rate_enrichment(rare, before, during)
    assert e.named and e.z > Z_NAMED and e.excess_fraction == pytest.approx(1 - 0.1 / 0.75)
    clock = np.full(100, 1980.0)
    clock[80:] = 1200.0
    assert shift_enrichment(clock, before, during, Direction.FALL, se_floor=19.8).named
    assert not shift_enrichment(clock, before, during, Direction.RISE, se_floor=19.8).named


def test_a_cotenant_as_busy_in_normal_windows_as_in_slow_ones_is_not_named() -> None:
    w = windows()
    sm = w.processes["sdxl"]["sm_util"]
    sm[::2] = 80.0  # bursts every other second, before as during
    w.models["sdxl"]["arrival_rps"][FAULT] *= 3  # its demand rose (it is not a fellow victim)
    slow_compute(w, 1.5)
    att = attribute(w, "tts", *masks())
    assert ("cotenant", "sdxl") not in named(att)
    sm[FAULT] = 85.0  # and now busier in the slow windows than it ever was
    att = attribute(w, "tts", *masks())
    assert named(att)[0] == ("cotenant", "sdxl")


def _busy_gpu(w) -> None:  # type: ignore[no-untyped-def]
    """The GPU idles (and down-clocks) in 6 of 10 normal windows, as a GPU between bursts does."""
    util = np.full(N, 70.0)
    clock = np.full(N, 1980.0)
    idle = (np.arange(N) % 10 < 6) & (np.arange(N) < FAULT.start)
    util[idle], clock[idle] = 3.0, 345.0
    w.counters["sm_util"], w.counters["sm_clock_mhz"] = util, clock


def test_a_clock_locked_low_while_busy_is_throttle_whatever_the_reasons_say() -> None:
    w = windows()
    _busy_gpu(w)
    w.counters["sm_clock_mhz"][FAULT] = 1000.0  # locked: no throttle reason set
    slow_compute(w, 1.8)
    att = attribute(w, "tts", *masks())
    thr = att.causes[0]
    assert (thr.kind, thr.culprit) == ("throttle", "gpu0")
    assert thr.evidence["busy_clock_mhz"] == {"before": 1980.0, "during": 1000.0}
    assert "locked" in thr.evidence and thr.evidence["clock_event_reasons"] == 0
    # every window's mean clock did not fall (the idle ones were lower): only busy ones tell
    assert np.mean(w.counters["sm_clock_mhz"][masks()[0]]) < 1000.0


def test_heavier_requests_of_any_model_are_its_mix_with_the_cost_before_and_after() -> None:
    w = windows()
    units = np.full(N, 2.0)
    units[FAULT] = 4.0  # twice the images per request
    slow_compute(w, 2.0)
    work = WorkSeries(units, "units", "tts images per request", "images")
    att = attribute(w, "tts", *masks(), work=work)
    mix = att.causes[0]
    assert (mix.kind, mix.culprit) == ("mix", "tts") and mix.share > 0.8
    assert (mix.evidence["before"], mix.evidence["during"]) == (2.0, 4.0)
    assert mix.evidence["explained_ms"] == pytest.approx(10.0, rel=0.05)


def test_heavier_compute_with_nothing_else_in_sight_is_mix_and_contention_is_not() -> None:
    w = windows()
    slow_compute(w, 2.0)
    assert named(attribute(w, "tts", *masks()))[0] == ("mix", "tts")
    w.processes["sdxl"]["sm_util"][FAULT] = 80.0  # a co-tenant got busier: its doing
    assert named(attribute(w, "tts", *masks()))[0] == ("cotenant", "sdxl")
    w2 = windows()
    slow_compute(w2, 2.0)
    w2.models["sdxl"]["compute_ms"][FAULT] *= 2  # the co-tenant slowed as much, demand flat
    att = attribute(w2, "tts", *masks())
    assert named(att) == [] and "fellow_victims" in att.causes[0].evidence


def test_heavier_compute_is_not_mix_when_no_per_process_series_could_show_a_cotenant() -> None:
    w = windows()
    for ps in w.processes.values():
        ps["sm_util"][:] = np.nan
    slow_compute(w, 2.0)
    assert named(attribute(w, "tts", *masks())) == []


def _tokens(w, output_during: float) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """Token windows of ``tts``: ~300-token prompts and ~60-token answers per request, the
    answers ``output_during`` long on average during the slowdown."""
    rng = np.random.default_rng(5)
    out = {f: np.full(N, np.nan) for f in TOKEN_FIELDS}
    out["count"] = w.models["tts"]["count"].copy()
    out["prompt_tokens_mean"] = 300.0 * np.exp(0.05 * rng.standard_normal(N))
    out["output_tokens_mean"] = 60.0 * np.exp(0.05 * rng.standard_normal(N))
    out["output_tokens_mean"][FAULT] *= output_during / 60.0
    return out


def test_an_llm_computing_longer_for_the_same_tokens_is_not_heavier_work() -> None:
    # a real vLLM alone on a shared host (make engines): compute per request 15.9 -> 22.4 ms
    # with the same prompts was named `mix` (its own heavier work) from the time alone
    w = windows()
    slow_compute(w, 2.0)
    w.tokens["tts"] = _tokens(w, 60.0)
    att = attribute(w, "tts", *masks())
    assert named(att) == [] and att.causes[0].kind == "unknown"
    # answers twice as long: the same rise is heavier work
    w.tokens["tts"] = _tokens(w, 120.0)
    assert named(attribute(w, "tts", *masks()))[0] == ("mix", "tts")


def test_a_work_series_with_no_value_during_the_slowdown_falls_back_to_compute_time() -> None:
    w = windows()
    slow_compute(w, 2.0)
    work = np.full(N, 50.0)
    work[FAULT] = np.nan  # the inference-time series was not reported then
    att = attribute(w, "tts", *masks(), work=WorkSeries(work, "time", "inference", "ms"))
    mix = att.causes[0]
    assert (mix.kind, mix.culprit) == ("mix", "tts")
    assert mix.evidence["series"] == "tts compute time per request"


def test_a_cotenant_idle_in_every_normal_window_is_named_for_a_short_burst() -> None:
    w = windows()
    w.processes["sdxl"]["sm_util"][:] = 0.0  # never ran before
    w.processes["sdxl"]["sm_util"][FAULT.start + 3] = 95.0  # one window of the slowdown
    w.models["sdxl"]["arrival_rps"][FAULT] *= 3
    slow_compute(w, 1.3)
    assert named(attribute(w, "tts", *masks()))[0] == ("cotenant", "sdxl")


def test_two_slow_windows_of_a_coarse_series_are_judged_against_the_normal_spread() -> None:
    # seen on GenTD26 (57-s steps, one request each): a container's inference time tripled
    # for two or three steps and was named nothing — the two steps' own spread made the
    # shift's standard error larger than the shift
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.normal(5500.0, 1500.0, 40), [14000.0, 38000.0]])
    before = np.zeros(len(x), dtype=bool)
    before[:40] = True
    test = shift_enrichment(x, before, ~before)
    assert test.named, test
    # and two ordinary windows are no shift
    y = np.concatenate([x[:40], [5000.0, 6500.0]])
    assert not shift_enrichment(y, before, ~before).named


def test_a_sparse_models_slowdown_is_compared_with_enough_normal_windows() -> None:
    from cotenant.analysis.diagnose import BEFORE_WINDOWS, _before_mask

    n = 7200
    count = np.zeros(n)
    count[::57] = 1.0  # one request a step of 57 s
    start = 7000
    before = _before_mask(n, start, np.zeros(n, dtype=bool), count, 1.0)
    # three minutes hold three of them; it looks back until it has enough
    assert before.sum() >= BEFORE_WINDOWS // 2
    assert not before[start:].any() and (count[before] > 0).all()

"""The benchmark's reference rankers (NSigma, BARO) and the BOCPD change point detector."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from cotenant.analysis.baselines import (
    Baro,
    NSigma,
    Ranker,
    anomaly_start,
    changepoint_probability,
    make_ranker,
)
from cotenant.core.errors import UsageError

N, START = 60, 40
RANKERS: list[Callable[[], Ranker]] = [
    NSigma,
    Baro,
    lambda: NSigma(two_sided=False),
    lambda: Baro(two_sided=False),
]
RANKER_IDS = ["nsigma", "baro", "nsigma-one-sided", "baro-one-sided"]


def gaussian(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.normal(0.0, 1.0, n)


def heavy_tailed(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_t(5, n)


def spiky(rng: np.random.Generator, n: int) -> np.ndarray:
    """Mostly calm with an occasional burst, like a latency percentile."""
    return rng.normal(0.0, 1.0, n) + (rng.random(n) < 0.05) * rng.exponential(2.0, n)


NOISE = [gaussian, heavy_tailed, spiky]


def suspects(
    noise: Callable[[np.random.Generator, int], np.ndarray], seed: int
) -> dict[str, np.ndarray]:
    """Eight candidates in different units and levels; ``culprit`` steps up by 20 of its own
    noise scales at ``START``, ``bystander`` by 2."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(8):
        level, scale = 10.0 ** rng.uniform(-2, 4), 10.0 ** rng.uniform(-2, 3)
        out[f"s{i}"] = level + scale * noise(rng, N)
    step = np.r_[np.zeros(START), np.ones(N - START)]
    out["culprit"] = 50.0 + 3.0 * (noise(rng, N) + 20.0 * step)
    out["bystander"] = 5.0 + 0.1 * (noise(rng, N) + 2.0 * step)
    return out


@pytest.mark.parametrize("make", RANKERS, ids=RANKER_IDS)
@pytest.mark.parametrize("noise", NOISE)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_ranker_puts_the_stepped_series_first(
    make: Callable[[], Ranker],
    noise: Callable[[np.random.Generator, int], np.ndarray],
    seed: int,
) -> None:
    ranked = make().rank(suspects(noise, seed), START)
    names = [n for n, _ in ranked]
    assert names[0] == "culprit"
    assert len(names) == 10
    scores = [s for _, s in ranked]
    assert scores == sorted(scores, reverse=True)


def test_baro_is_robust_to_an_outlier_in_the_baseline_where_nsigma_is_not() -> None:
    rng = np.random.default_rng(7)
    culprit = np.r_[rng.normal(0, 1, START), rng.normal(10, 1, N - START)]
    culprit[5] = 1000.0  # one wild sample long before the anomaly inflates the std
    decoy = np.r_[rng.normal(0, 1, START), rng.normal(5, 1, N - START)]
    series = {"culprit": culprit, "decoy": decoy}
    assert Baro().rank(series, START)[0][0] == "culprit"
    assert NSigma().rank(series, START)[0][0] == "decoy"


@pytest.mark.parametrize("make", [NSigma, Baro], ids=["nsigma", "baro"])
def test_two_sided_rankers_see_a_drop_and_one_sided_ones_do_not(make: type[Ranker]) -> None:
    rng = np.random.default_rng(3)
    series = {
        "drops": np.r_[rng.normal(100, 1, START), rng.normal(80, 1, N - START)],
        "rises": np.r_[rng.normal(100, 1, START), rng.normal(104, 1, N - START)],
    }
    assert make().rank(series, START)[0][0] == "drops"  # type: ignore[call-arg]
    assert make(two_sided=False).rank(series, START)[0][0] == "rises"  # type: ignore[call-arg]


@pytest.mark.parametrize("make", RANKERS, ids=RANKER_IDS)
def test_constant_nan_and_empty_series(make: Callable[[], Ranker]) -> None:
    rng = np.random.default_rng(0)
    moving = np.r_[rng.normal(0, 1, START), rng.normal(6, 1, N - START)]
    holey = moving.copy()
    holey[::3] = np.nan  # gaps on both sides: still scored on what is there
    series = {
        "flat": np.full(N, 4.0),
        "moving": moving,
        "holey": holey,
        "no-baseline": np.r_[np.full(START, np.nan), np.ones(N - START)],
        "no-anomaly-data": np.r_[np.ones(START), np.full(N - START, np.nan)],
    }
    ranked = dict(make().rank(series, START))
    assert set(ranked) == {"flat", "moving", "holey"}  # nothing to compare: left out
    assert ranked["flat"] == 0.0
    assert ranked["moving"] > 3 and ranked["holey"] > 3
    assert make().rank({}, 3) == []


@pytest.mark.parametrize("make", RANKERS, ids=RANKER_IDS)
def test_rankers_refuse_windows_they_cannot_split(make: Callable[[], Ranker]) -> None:
    r = make()
    with pytest.raises(UsageError, match="no window before or after"):
        r.rank({"a": np.ones(5)}, 0)
    with pytest.raises(UsageError, match="no window before or after"):
        r.rank({"a": np.ones(5)}, 5)
    with pytest.raises(UsageError, match="differ in length"):
        r.rank({"a": np.ones(5), "b": np.ones(6)}, 2)


def test_a_single_baseline_window_counts_as_zero_spread() -> None:
    # one window before: no spread to estimate; like scikit-learn's scalers, a zero scale is 1
    series = {"big": np.array([1.0, 9.0, 9.0]), "small": np.array([1.0, 2.0, 2.0])}
    for r in (Baro(), NSigma()):
        assert r.rank(series, 1) == [("big", 8.0), ("small", 1.0)]


def test_make_ranker_names_the_known_baselines() -> None:
    assert make_ranker("baro").name == "baro"
    assert make_ranker("nsigma").name == "nsigma"
    with pytest.raises(UsageError, match="choose from baro, nsigma"):
        make_ranker("pagerank")


# --------------------------------------------------------------------------------- BOCPD


def planted(
    noise: Callable[[np.random.Generator, int], np.ndarray], seed: int, at: int, n: int = 80
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 0.2 + 0.01 * noise(rng, n) + 0.12 * (np.arange(n) >= at)


@pytest.mark.parametrize("noise", NOISE)
@pytest.mark.parametrize(("seed", "at"), [(1, 30), (2, 55), (3, 12), (4, 70)])
def test_bocpd_finds_a_planted_change_point_within_two_windows(
    noise: Callable[[np.random.Generator, int], np.ndarray], seed: int, at: int
) -> None:
    found = anomaly_start(planted(noise, seed, at))
    assert found is not None
    assert abs(found - at) <= 2


def test_bocpd_probability_peaks_at_the_change() -> None:
    x = planted(gaussian, 9, 40)
    p = changepoint_probability(x)
    assert p.shape == x.shape
    assert int(np.argmax(p)) == 40
    assert p[40] > 0.9
    assert np.all((p >= 0) & (p <= 1))


def test_bocpd_on_short_series_like_one_minute_cases() -> None:
    # four calm windows then five slow ones, as in a one-minute-per-row incident table
    x = np.array([0.61, 0.63, 0.60, 0.62, 5.1, 4.8, 5.3, 5.0, 4.9])
    assert anomaly_start(x) == 4


def test_bocpd_skips_nan_windows() -> None:
    x = planted(gaussian, 5, 30)
    x[[3, 17, 29, 31, 50]] = np.nan
    p = changepoint_probability(x)
    assert np.all(p[[3, 17, 29, 31, 50]] == 0)
    found = anomaly_start(x)
    assert found is not None and abs(found - 30) <= 2


def test_bocpd_constant_and_too_short_series_have_no_change_point() -> None:
    assert anomaly_start(np.full(50, 3.0)) is None
    assert not changepoint_probability(np.full(50, 3.0)).any()
    assert anomaly_start(np.array([1.0, 1.0, 9.0, 9.0])) is None  # needs 3 before, 2 after
    assert anomaly_start(np.array([])) is None
    assert not changepoint_probability(np.array([np.nan, 1.0])).any()


def test_bocpd_direction_filters_recoveries() -> None:
    rng = np.random.default_rng(11)
    drop = 1.0 + 0.01 * rng.normal(size=60) - 0.5 * (np.arange(60) >= 25)
    assert anomaly_start(drop, direction=1) is None  # latency fell: not a spike
    found = anomaly_start(drop, direction=-1)
    assert found is not None and abs(found - 25) <= 2
    assert anomaly_start(drop, direction=0) == found


def test_bocpd_rejects_bad_parameters() -> None:
    with pytest.raises(UsageError, match="lag"):
        changepoint_probability(np.ones(5), lag=0)
    with pytest.raises(UsageError, match="hazard"):
        changepoint_probability(np.ones(5), hazard=1.5)
    with pytest.raises(UsageError, match="direction"):
        anomaly_start(np.ones(5), direction=2)


def test_baro_end_to_end_finds_the_start_then_the_culprit() -> None:
    rng = np.random.default_rng(4)
    series = suspects(gaussian, 4)
    latency = 0.2 + 0.01 * rng.normal(size=N) + 0.1 * (np.arange(N) >= START)
    start, ranked = Baro().rank_detect(series, latency)
    assert abs(start - START) <= 2
    assert ranked[0][0] == "culprit"
    with pytest.raises(UsageError, match="no change point"):
        Baro().rank_detect(series, np.full(N, 0.2))

"""The oracle CUSUM: textbook delay on a known shift, calibrated false alarms on fresh null data."""

from __future__ import annotations

import numpy as np
import pytest

from cotenant.core.errors import UsageError
from cotenant.evaluation.intervals import poisson_rate
from cotenant.evaluation.oracle import (
    LatencyRatio,
    calibrate,
    cusum_alarms,
    first_alarm,
    window_increments,
)

SHIFT = 1.0  # in standard deviations of log latency


def _siegmund_delay(h: float, mu: float) -> float:
    """Siegmund's approximation of the CUSUM's mean delay (observations) for a N(0,1) -> N(mu,1)
    shift with the log-likelihood ratio as increment (Siegmund 1985, eq. 2.56)."""
    b = h / mu + 0.583 * 2
    d = mu / 2
    return (np.exp(-2 * d * b) + 2 * d * b - 1) / (2 * d * d)


def _siegmund_arl0(h: float, mu: float) -> float:
    b = h / mu + 0.583 * 2
    d = -mu / 2
    return (np.exp(-2 * d * b) + 2 * d * b - 1) / (2 * d * d)


def _gaussian_llr(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = SHIFT * x - SHIFT**2 / 2
    return out


@pytest.mark.parametrize("h", [4.0, 8.0])
def test_a_cusum_on_a_known_shift_detects_in_the_textbook_delay(h: float) -> None:
    rng = np.random.default_rng(11)
    delays = [
        int(cusum_alarms(_gaussian_llr(rng.normal(SHIFT, 1.0, 200)), h)[0]) + 1 for _ in range(600)
    ]
    assert np.mean(delays) == pytest.approx(_siegmund_delay(h, SHIFT), rel=0.08)


def test_a_ratio_fitted_on_latencies_knows_the_shift_about_as_well_as_the_exact_one() -> None:
    rng = np.random.default_rng(3)
    sigma = 0.2  # log latency spread: a 1-sigma shift is a 1.22x slowdown of every request
    before = np.exp(np.log(20.0) + sigma * rng.normal(size=20_000))
    after = np.exp(np.log(20.0) + sigma * (SHIFT + rng.normal(size=20_000)))
    ratio = LatencyRatio.fit(before, after)
    # KL of N(1,1) from N(0,1) is 0.5 nats; a 50-bin histogram estimates it a little off
    assert ratio.divergence() == pytest.approx(0.5, rel=0.15)
    h = 6.0
    fitted, exact = [], []
    for _ in range(400):
        z = rng.normal(SHIFT, 1.0, 200)
        lat = np.exp(np.log(20.0) + sigma * z)
        fitted.append(int(cusum_alarms(ratio(lat), h)[0]) + 1)
        exact.append(int(cusum_alarms(_gaussian_llr(z), h)[0]) + 1)
    assert np.mean(fitted) == pytest.approx(np.mean(exact), rel=0.2)
    # a request as slow as after the change is evidence for it, one as fast as before against
    assert ratio(np.array([20.0]))[0] < 0 < ratio(np.array([20.0 * np.exp(2 * sigma)]))[0]


def test_its_false_alarm_rate_on_fresh_null_data_matches_the_calibration() -> None:
    rng = np.random.default_rng(5)
    # one observation per 1-s window; 20 fault-free hours to calibrate on
    null_runs = [_gaussian_llr(rng.normal(0.0, 1.0, 3600)) for _ in range(20)]
    curve = calibrate(null_runs, 1.0, hours=300.0, chains=200, seed=1)
    target = 2.0  # per hour: an ARL of 1,800 windows, testable on 150 fresh hours
    h = curve.threshold(target)
    predicted = curve.rate_at(h)
    assert 0.6 * target <= predicted <= target  # the grid's step below the rate asked
    # the bootstrap agrees with the textbook ARL at that threshold
    assert predicted == pytest.approx(3600 / _siegmund_arl0(h, SHIFT), rel=0.3)
    fresh_hours = 150
    fresh = _gaussian_llr(rng.normal(0.0, 1.0, 3600 * fresh_hours))
    seen = len(cusum_alarms(fresh, h))
    ci = poisson_rate(seen, fresh_hours, level=0.99)
    assert ci.low <= predicted <= ci.high, (seen, predicted)
    # and after a shift the same threshold finds it at once
    assert (
        first_alarm(
            np.concatenate([fresh[:600], _gaussian_llr(rng.normal(SHIFT, 1, 60))]), h, 600, 660
        )
        is not None
    )


def test_window_increments_sum_the_requests_of_each_window_and_drop_the_rest() -> None:
    inc = window_increments(
        np.array([0.1, 0.9, 1.5, 2.99, 3.0, -0.5]),
        np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0]),
        3.0,
        1.0,
    )
    assert inc.tolist() == [3.0, 4.0, 8.0]


def test_the_cusum_restarts_after_an_alarm_and_ignores_alarms_outside_the_range() -> None:
    x = np.array([3.0, 3.0, -10.0, 2.0, 2.0, 2.0])
    assert cusum_alarms(x, 5.0).tolist() == [1, 5]
    assert first_alarm(x, 5.0, 2, 6) == 5
    assert first_alarm(x, 5.0, 2, 5) is None


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: LatencyRatio.fit([], [1.0]), "before_ms"),
        (lambda: LatencyRatio.fit([1.0, -2.0], [1.0]), "not finite and > 0"),
        (lambda: window_increments(np.zeros(2), np.zeros(3), 10.0, 1.0), "differ in shape"),
        (lambda: cusum_alarms(np.zeros(3), 0.0), "threshold must be > 0"),
        (lambda: calibrate([np.zeros(10)], 1.0, block=60), "at least 60 windows"),
        (lambda: calibrate([np.zeros(100)], 1.0, hours=1.0, block=10).threshold(0.01), "more than"),
    ],
)
def test_bad_input_is_refused_with_what_is_wrong(call: object, needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        call()  # type: ignore[operator]

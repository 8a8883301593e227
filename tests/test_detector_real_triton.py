"""The detector on a real Triton's requests (tests/fixtures/engines/triton-2.51.0/
quiet-then-burst, PROVENANCE.md): a CPU ``matmul`` model at 20 requests/s on a two-core machine,
15 quiet minutes before a Ray Serve burst. Its median is 3.5 ms and its p99 about 7 ms, so a
slowdown of a millisecond or two is what its users see; slowdowns injected into its quiet
stretch must be found as ``bench/real_noise.py --runs`` finds them (docs/accuracy.md, "Real
engine noise")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from detector_series import windows

from cotenant.analysis.detector.detect import DetectorParams, detect

HERE = Path(__file__).parent / "fixtures" / "engines" / "triton-2.51.0" / "quiet-then-burst"
META = json.loads((HERE / "runs.json").read_text())["run1"]
BURST_S = float(META["burner_s"])
SLACK_S = 5.0
OWN_S = 790.0
"""Where the recording's own slowdown begins (its 15th minute: the median 1.4x, the p99 2.5x,
nothing injected; the live loop opened an incident there while it was recorded)."""


def strong_starts(slow: tuple[float, float, float] | None = None) -> list[float]:
    """Where each strong episode of the e2e series begins (s) before the burst; ``slow``:
    ``(start_s, end_s, factor)`` multiplies the requests of that span."""
    d = np.genfromtxt(HERE / "run1.csv", delimiter=",", names=True)
    t, lat = d["t_s"], d["latency_ms"]
    if slow is not None:
        lat = np.where((t >= slow[0]) & (t < slow[1]), lat * slow[2], lat)
    s = windows(t, lat, float(t[-1]) + 1.0)
    track = detect(s, None, DetectorParams(), step_s=1.0, indicators=int(META["indicators"]))
    return [float(e.start) for e in track.episodes if e.strong and e.start < BURST_S - SLACK_S]


def test_a_real_tritons_quiet_stretch_opens_only_its_own_slowdown() -> None:
    starts = strong_starts()
    assert len(starts) == 1 and abs(starts[0] - OWN_S) <= 30.0, starts


@pytest.mark.parametrize(("factor", "least"), [(2.0, 12), (1.5, 4)])
def test_slowdowns_injected_into_a_real_tritons_noise_are_found(factor: float, least: int) -> None:
    # onsets every 40 s from 240 s (the warm-up and a minute) to the recording's own slowdown:
    # a doubling for a minute is always found (13 of 13), 1.5x in 5 of 13. The floors are
    # those counts less one. The dead zone's millisecond term holds 1.5x back here (half a ms
    # over a 3.5-ms normal is 1.14x); taken at the p99 instead it found 9 of 13, but raised the
    # test population's false incidents on controls from 9 to 12 (docs/accuracy.md, "Real
    # engine noise")
    found = n = 0
    for onset in np.arange(240.0, OWN_S - 60.0 + 1e-9, 40.0):
        starts = strong_starts((onset, onset + 60.0, factor))
        n += 1
        found += any(onset - SLACK_S <= s <= onset + 60.0 for s in starts)
    assert n == 13
    assert found >= least, (found, n)

"""cotenant.collectors.otlp.critical_path: the per-phase split of one request's latency."""

from __future__ import annotations

import random

import pytest

from cotenant.collectors.otlp.critical_path import critical_path
from cotenant.core.phases import PHASES

OTHER = PHASES.index("other")
Q, LOCK, PRE, H2D, COMPUTE, D2H, POST = (
    PHASES.index(p)
    for p in ("queue", "lock_wait", "preprocess", "h2d", "compute", "d2h", "postprocess")
)
CHILD_PHASES = [i for i in range(len(PHASES)) if i != OTHER]


def split(start: int, end: int, children: list[tuple[int, int, int]]) -> dict[str, int]:
    """The non-zero phases by name."""
    out = critical_path(start, end, children)
    assert len(out) == len(PHASES)
    return {PHASES[i]: v for i, v in enumerate(out) if v}


def union_length(intervals: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for s, e in sorted(intervals):
        if reach is None or s > reach:
            total += e - s
            reach = e
        elif e > reach:
            total += e - reach
            reach = e
    return total


def clipped(
    start: int, end: int, children: list[tuple[int, int, int]]
) -> list[tuple[int, int, int]]:
    return [(p, max(s, start), min(e, end)) for p, s, e in children if min(e, end) > max(s, start)]


def test_no_children_is_all_other() -> None:
    assert split(100, 350, []) == {"other": 250}


@pytest.mark.parametrize(("start", "end"), [(100, 100), (100, 40)])
def test_empty_or_inverted_root_is_all_zero(start: int, end: int) -> None:
    assert critical_path(start, end, [(COMPUTE, 0, 1000)]) == [0] * len(PHASES)


def test_back_to_back_children_split_exactly() -> None:
    kids = [(Q, 0, 10), (PRE, 10, 25), (H2D, 25, 30), (COMPUTE, 30, 90), (D2H, 90, 95)]
    assert split(0, 100, kids) == {
        "queue": 10,
        "preprocess": 15,
        "h2d": 5,
        "compute": 60,
        "d2h": 5,
        "other": 5,
    }


def test_gaps_go_to_other() -> None:
    kids = [(Q, 10, 20), (COMPUTE, 50, 70)]
    # 0-10, 20-50 and 70-100 are the root's own time
    assert split(0, 100, kids) == {"queue": 10, "compute": 20, "other": 70}


def test_order_of_children_does_not_matter() -> None:
    kids = [(Q, 0, 30), (LOCK, 20, 40), (COMPUTE, 35, 80), (POST, 85, 99)]
    want = critical_path(0, 100, kids)
    rnd = random.Random(7)
    for _ in range(20):
        rnd.shuffle(kids)
        assert critical_path(0, 100, kids) == want


def test_overlapping_children_are_counted_once() -> None:
    # two phases over the same 80 ns: the request still took 100 ns, not 180
    out = split(0, 100, [(Q, 10, 90), (LOCK, 10, 90)])
    assert sum(out.values()) == 100
    assert out["other"] == 20
    assert out.get("queue", 0) + out.get("lock_wait", 0) == 80


def test_overlap_is_split_at_the_later_childs_start() -> None:
    # queue 0-50 overlaps compute 40-100; walking back from the end, compute owns 40-100
    assert split(0, 100, [(Q, 0, 50), (COMPUTE, 40, 100)]) == {"queue": 40, "compute": 60}


def test_last_finishing_child_wins_at_the_end() -> None:
    # a long lock wait that finishes last hides the compute span inside it
    assert split(0, 100, [(COMPUTE, 20, 60), (LOCK, 10, 95)]) == {
        "lock_wait": 85,
        "other": 15,
    }


def test_children_are_clipped_to_the_root() -> None:
    kids = [(Q, -50, 20), (COMPUTE, 60, 400)]
    assert split(0, 100, kids) == {"queue": 20, "compute": 40, "other": 40}


def test_children_wholly_outside_the_root_are_ignored() -> None:
    kids = [(Q, -50, -10), (COMPUTE, 100, 200), (D2H, 150, 160), (PRE, -5, 0)]
    assert split(0, 100, kids) == {"other": 100}


def test_zero_length_children_take_no_time() -> None:
    assert split(0, 10, [(Q, 5, 5), (COMPUTE, 10, 10)]) == {"other": 10}


def test_nanosecond_timestamps_of_today_stay_exact() -> None:
    base = 1_764_662_400_123_456_789
    kids = [(Q, base + 1, base + 1_000_001), (COMPUTE, base + 1_000_001, base + 9_999_999)]
    out = critical_path(base, base + 10_000_000, kids)
    assert out[Q] == 1_000_000
    assert out[COMPUTE] == 8_999_998
    assert out[OTHER] == 2
    assert all(isinstance(v, int) for v in out)


def _random_case(rnd: random.Random) -> tuple[int, int, list[tuple[int, int, int]]]:
    start = rnd.randint(-1000, 1000)
    end = start + rnd.choice([0, 1, rnd.randint(1, 50), rnd.randint(1, 5000)])
    kids = []
    for _ in range(rnd.randint(0, 12)):
        # small grid so that shared edges and exact overlaps are common; many reach outside
        s = rnd.randint(start - 200, end + 200) if rnd.random() < 0.7 else start
        e = s + rnd.choice([0, rnd.randint(0, 40), rnd.randint(0, 3000)])
        kids.append((rnd.choice(CHILD_PHASES), s, e))
    return start, end, kids


def test_properties_over_random_children() -> None:
    rnd = random.Random(20261202)
    for _ in range(3000):
        start, end, kids = _random_case(rnd)
        out = critical_path(start, end, kids)
        ctx = (start, end, kids, out)
        duration = max(end - start, 0)
        assert sum(out) == duration, ctx
        assert all(v >= 0 for v in out), ctx
        inside = clipped(start, end, kids)
        covered = union_length([(s, e) for _, s, e in inside])
        # time no child covers is 'other', and nothing else is: overlaps are counted once
        assert out[OTHER] == duration - covered, ctx
        for phase in CHILD_PHASES:
            mine = union_length([(s, e) for p, s, e in inside if p == phase])
            assert out[phase] <= mine, ctx


def test_disjoint_random_children_are_booked_in_full() -> None:
    rnd = random.Random(99)
    for _ in range(1000):
        start = rnd.randint(0, 10_000)
        cuts = sorted(rnd.sample(range(start, start + 10_000), rnd.randint(2, 20)))
        end = cuts[-1] + rnd.randint(0, 100)
        kids = []
        want = [0] * len(PHASES)
        for a, b in zip(cuts[::2], cuts[1::2], strict=False):  # odd last cut unused
            p = rnd.choice(CHILD_PHASES)
            kids.append((p, a, b))
            want[p] += b - a
        want[OTHER] = (end - start) - sum(want)
        rnd.shuffle(kids)
        assert critical_path(start, end, kids) == want, (start, end, kids)


def test_input_is_not_modified() -> None:
    kids = [(COMPUTE, 30, 90), (Q, 0, 40)]
    before = list(kids)
    critical_path(0, 100, kids)
    assert kids == before

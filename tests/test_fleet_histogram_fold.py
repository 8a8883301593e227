"""``FleetHistogram`` folds the batches it was given when it is read: the exposition is the
same as when each batch is folded as it arrives (a phase counted per batch that used it,
exemplars the newest request of each bucket, lock waits, errors)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from test_store import make_requests

from cotenant.collectors import fleet_histogram
from cotenant.collectors.fleet_histogram import FleetHistogram


def _batches() -> list[pa.Table]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(12):
        t = make_requests(rng, 40, models=("a", "b"), gpus=("GPU-0", "GPU-1"))
        if i % 3:  # most batches: no request waits on a lock, or preprocesses
            for col in ("lock_wait_ms", "preprocess_ms"):
                t = t.set_column(t.schema.get_field_index(col), col, pa.array(np.zeros(t.num_rows)))
        if i == 5:  # a pair that appears once, in a folded run
            t = t.set_column(t.schema.get_field_index("model"), "model", pa.array(["c"] * 40))
        out.append(t)
    return out


def _exposition(h: FleetHistogram) -> dict[str, float | str]:
    """Each line's value (its exemplar too) by series; the order of series is not part of the
    format."""
    out: dict[str, float | str] = {}
    for line in h.render(openmetrics=True).splitlines():
        if line.startswith("#"):
            continue
        series, _, rest = line.partition("} ")
        value, _, exemplar = rest.partition(" # ")
        out[series] = float(value)
        if exemplar:
            out[series + " exemplar"] = exemplar
    for m in h.collect():
        for s in m.samples:
            out[f"{s.name}{sorted(s.labels.items())}"] = s.value
    return out


def test_folding_many_batches_at_a_read_exposes_what_folding_each_does() -> None:
    one_by_one, folded = FleetHistogram("n"), FleetHistogram("n")
    for t in _batches():
        one_by_one.observe_requests(t)
        one_by_one.render()  # a read folds what is waiting: here, this batch alone
        folded.observe_requests(t)
    want, got = _exposition(one_by_one), _exposition(folded)
    assert got.keys() == want.keys()
    for k, v in want.items():  # sums are added in another order: equal to rounding
        assert got[k] == (pytest.approx(v, rel=1e-12) if isinstance(v, float) else v), k
    assert folded.series == one_by_one.series
    assert 'phase="lock_wait"' in folded.render()


def test_waiting_rows_are_bounded_without_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet_histogram, "FOLD_ROWS", 100)
    h = FleetHistogram("n")
    for t in _batches()[:5]:
        h.observe_requests(t)
    assert h._waiting_rows < 100  # folded at 120 rows, 80 waiting

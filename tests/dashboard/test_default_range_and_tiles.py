"""What a page opens with when the data is younger than the default range (a fresh demo: six
minutes, not squeezed into the right edge of "last 1 h"), and a model tile that counts the
incidents still being diagnosed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_dashboard_app import _callback

from cotenant.analysis.diagnosis import Diagnosis
from cotenant.analysis.incident_record import Incident, to_stored
from cotenant.dashboard.app import create_app
from cotenant.dashboard.data import DashboardData
from cotenant.dashboard.timerange import FIT_MIN_NS, fit_to_data, parse_range
from cotenant.store.db import Store
from cotenant.store.incident_rows import upsert_incidents

NOW = 1_796_000_000_000_000_000
S = 1_000_000_000
MIN = 60 * S


@pytest.mark.parametrize(
    "first_s_ago,want_since_s_ago",
    [
        (360, 378),  # 6 min of data: from a twentieth of it before the first record
        (120, 300),  # 2 min: the fitted range is still 5 min long
        (3000, 3150),  # 50 min
    ],
)
def test_a_default_range_longer_than_the_data_is_fitted(
    first_s_ago: int, want_since_s_ago: int
) -> None:
    rng = fit_to_data(parse_range(None, NOW, "1h"), NOW - first_s_ago * S)
    assert (rng.until_ns, rng.live) == (NOW, True)
    assert rng.since_ns == NOW - want_since_s_ago * S
    assert rng.until_ns - rng.since_ns >= FIT_MIN_NS
    # the text is a range the URL and the picker take, and it reads the same range
    again = parse_range(rng.text, NOW)
    assert (again.since_ns, again.until_ns, again.live) == (rng.since_ns, NOW, True)


@pytest.mark.parametrize(
    "rng,first_ns",
    [
        (parse_range("1h", NOW), None),  # nothing stored
        (parse_range("1h", NOW), NOW - 2 * 3600 * S),  # data older than the range
        (parse_range("1h", NOW), NOW - 3599 * S),  # as old as the range, to a margin
        (parse_range("2026-12-01T10:00:00Z..2026-12-01T11:00:00Z", NOW), NOW - MIN),  # fixed
    ],
)
def test_a_range_the_data_fills_is_kept(rng: Any, first_ns: int | None) -> None:
    assert fit_to_data(rng, first_ns) == rng


def _requests(store: Store, model: str, ends_ns: list[int]) -> None:
    table = pa.table(
        {
            "ts_start_ns": [e - 50_000_000 for e in ends_ns],
            "ts_end_ns": ends_ns,
            "latency_ms": [50.0] * len(ends_ns),
            "model": [model] * len(ends_ns),
            "gpu": ["gpu0"] * len(ends_ns),
            "status": ["ok"] * len(ends_ns),
        }
    )
    with store.cursor() as cur:
        cur.register("_t", table)
        cur.execute("INSERT INTO requests BY NAME SELECT * FROM _t")
        cur.unregister("_t")


def _incident(iid: str, model: str, state: str) -> Incident:
    start, end = NOW - 2 * MIN, NOW - 10 * S
    told = Diagnosis(model, "gpu0", start, end, False, start, 155.0, 60.0, 100.0, {}, [])
    return Incident(
        id=iid,
        model=model,
        gpu="gpu0",
        state=state,
        start_ns=start,
        end_ns=end,
        updated_ns=end,
        peak_p99_ms=155.0,
        baseline_p99_ms=60.0,
        slo_ms=100.0,
        told=told,
    )


TILES = "ov-models.children...ov-gpus.children...ov-range-label.children"


def _tiles(app: Any, range_: str | None) -> dict[str, Any]:
    return _callback(
        app.server.test_client(),
        TILES,
        [
            {"id": "ov-params", "property": "data", "value": {"range": range_}},
            {"id": "shell-tick", "property": "n_intervals", "value": None},
        ],
    )


def test_the_overview_opens_on_the_data_and_counts_diagnosing_incidents(tmp_path: Path) -> None:
    with Store(":memory:") as store:
        # six minutes of requests, the newest within the tiles' last minute
        _requests(store, "tts", [NOW - k * 10 * S for k in range(36, 0, -1)])
        _requests(store, "chat", [NOW - k * 10 * S for k in range(6, 0, -1)])
        upsert_incidents(
            store,
            [
                to_stored(_incident("inc-a", "tts", "diagnosing")),
                to_stored(_incident("inc-b", "chat", "open")),
                to_stored(_incident("inc-c", "chat", "diagnosing")),
                to_stored(_incident("inc-d", "chat", "resolved")),
            ],
        )
        app = create_app(DashboardData(store, clock_ns=lambda: NOW), report_dir=tmp_path)

        opened = _tiles(app, None)
        label = opened["ov-range-label"]["children"]
        first = NOW - 360 * S - 50_000_000
        fitted = fit_to_data(parse_range(None, NOW, "1h"), first)
        assert fitted.until_ns - fitted.since_ns < 8 * MIN
        assert label == fitted.label() + " (live)", label
        # a range the user picked is kept
        assert _tiles(app, "1h")["ov-range-label"]["children"] == (
            parse_range("1h", NOW).label() + " (live)"
        )

        tiles = {_title(t): t for t in opened["ov-models"]["children"]}
        assert _row(tiles["tts"], "open incidents") == "1 (1 diagnosing)"
        assert _row(tiles["chat"], "open incidents") == "2 (1 diagnosing)"
        # a tile with a live incident is marked, diagnosing or not
        assert "tile-alert" in tiles["tts"]["props"]["className"]


def _title(tile: dict[str, Any]) -> str:
    return str(tile["props"]["children"][0]["props"]["children"])


def _row(tile: dict[str, Any], name: str) -> str:
    rows = tile["props"]["children"][1]["props"]["children"]
    for tr in rows:
        key, value = (td["props"]["children"] for td in tr["props"]["children"])
        if key == name:
            return str(value)
    raise AssertionError(f"no row {name!r} in {rows}")

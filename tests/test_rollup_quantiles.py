"""The two p99 aggregates over rollup rows (``store.rollup_quantiles``) against the exact p99 of
the raw requests they summarise, and ``store.bulk_load``."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

from cotenant.core.errors import UsageError
from cotenant.store.bulk_load import append_tables
from cotenant.store.db import Store
from cotenant.store.maintenance import Maintenance
from cotenant.store.rollup_quantiles import quantile_estimate_sql, quantile_upper_bound_sql
from cotenant.store.schema import arrow_schema

MIN = 60_000_000_000
T0 = 1_796_000_000 * 1_000_000_000 // MIN * MIN


def _requests(gpu: str, latency_ms: np.ndarray, minute_ns: int) -> pa.Table:
    n = len(latency_ms)
    end = minute_ns + np.linspace(0, MIN - 1, n).astype(np.int64)
    cols = {
        "ts_start_ns": end - (latency_ms * 1e6).astype(np.int64),
        "ts_end_ns": end,
        "latency_ms": latency_ms,
        "model": ["chat"] * n,
        "gpu": [gpu] * n,
        "status": ["ok"] * n,
    }
    schema = arrow_schema("requests")
    return pa.table(
        [pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema],
        schema=schema,
    )


@pytest.fixture
def store() -> Iterator[Store]:
    s = Store(":memory:")
    yield s
    s.close()


def _rolled_up(store: Store, by_gpu: dict[str, list[np.ndarray]]) -> None:
    """Append each GPU's latencies, one array per minute from T0, and roll them up."""
    tables = [
        _requests(gpu, lat, T0 + k * MIN)
        for gpu, mins in by_gpu.items()
        for k, lat in enumerate(mins)
    ]
    append_tables(store, {"requests": pa.concat_tables(tables)})
    Maintenance(store, clock_ns=lambda: T0).refresh_rollups()


def _one(store: Store, sql: str) -> float:
    with store.cursor() as cur:
        row = cur.execute(sql).fetchone()
    assert row is not None
    return float(row[0])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_max_bounds_the_pooled_p99_of_a_minute_and_the_estimate_does_not(
    store: Store, seed: int
) -> None:
    # a busy fast GPU and a quiet slow one serving one model in one minute
    rng = np.random.default_rng(seed)
    fast = rng.lognormal(3.0, 0.3, 3000)
    slow = rng.lognormal(4.5, 0.3, 100)
    _rolled_up(store, {"gpu-0": [fast], "gpu-1": [slow]})
    exact = _one(store, "SELECT quantile_cont(latency_ms, 0.99) FROM requests")
    bound = _one(store, f"SELECT {quantile_upper_bound_sql('p99_ms')} FROM request_rollup_1m")
    estimate = _one(store, f"SELECT {quantile_estimate_sql('p99_ms')} FROM request_rollup_1m")
    lowest = _one(store, "SELECT min(p99_ms) FROM request_rollup_1m")
    assert bound >= exact
    assert lowest <= estimate <= bound
    # the quiet GPU's slow tail is the pooled p99; the busy GPU pulls the estimate under it,
    # which is why the estimate must not decide whether an SLO was met
    assert estimate < exact


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_estimate_over_minutes_of_one_distribution_is_close_to_the_exact_p99(
    store: Store, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    minutes = [rng.lognormal(3.0, 0.5, int(n)) for n in rng.integers(2000, 4000, 5)]
    _rolled_up(store, {"gpu-0": minutes})
    exact = _one(store, "SELECT quantile_cont(latency_ms, 0.99) FROM requests")
    estimate = _one(store, f"SELECT {quantile_estimate_sql('p99_ms')} FROM request_rollup_1m")
    weighted = np.average(
        [np.quantile(m, 0.99) for m in minutes], weights=[len(m) for m in minutes]
    )
    assert estimate == pytest.approx(weighted, rel=1e-9)
    assert estimate == pytest.approx(exact, rel=0.1)


@pytest.mark.parametrize("column", ["p99_ms; DROP TABLE requests", "max(p99_ms)", ""])
def test_only_column_names_are_spliced_into_sql(column: str) -> None:
    with pytest.raises(UsageError, match="not a column name"):
        quantile_estimate_sql(column)
    with pytest.raises(UsageError, match="not a column name"):
        quantile_upper_bound_sql(column)


def test_bulk_load_appends_by_name_and_refuses_other_tables(store: Store) -> None:
    rows = _requests("gpu-0", np.array([10.0, 20.0]), T0).select(["ts_end_ns", "latency_ms"])
    append_tables(
        store, {"requests": rows, "gpu_samples": pa.table({"ts_ns": pa.array([], pa.int64())})}
    )
    append_tables(store, {"requests": rows})
    assert _one(store, "SELECT count(*) FROM requests WHERE model IS NULL") == 4
    with pytest.raises(UsageError, match="not store tables: nope"):
        append_tables(store, {"nope": rows})

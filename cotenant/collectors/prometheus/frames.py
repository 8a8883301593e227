"""Dense per-window columns from PromQL answers, made into :mod:`store.frames` tables.

Pure numpy / Arrow, no I/O: :class:`collectors.prometheus.source.PrometheusSource` reads the series
(:mod:`collectors.prometheus.client`), places them on ``(model, gpu)`` or ``(host, gpu)`` keys, and
hands them here to be added up and laid out as rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa

from cotenant.collectors.prometheus import families
from cotenant.collectors.prometheus.client import Fields
from cotenant.collectors.prometheus.promql import QUANTILES, Grid


def div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b where b > 0, else NaN (no warnings)."""
    out = np.full(np.broadcast(a, b).shape, np.nan)
    np.divide(a, b, out=out, where=(b > 0) & ~np.isnan(a))
    return out


def windows_with_data(f: Fields) -> np.ndarray:
    """bool[n windows]: where any field has a value (``f`` must not be empty)."""
    arrays = list(f.values())
    out = np.zeros(arrays[0].shape, bool)
    for a in arrays:
        out |= ~np.isnan(a)
    return out


def merge(fs: list[Fields], *, means: tuple[str, ...]) -> Fields:
    """Series landing on one key: fields add up, except ``means`` (averaged) and quantiles
    (averaged weighted by ``rate``). Names go through :data:`families.ALIASES` first."""
    fs = [{families.ALIASES.get(k, k): v for k, v in f.items()} for f in fs]
    if len(fs) == 1:
        return fs[0]
    n = next(iter(fs[0].values())).shape[0]
    out: Fields = {}
    for name in {k for f in fs for k in f}:
        x = np.vstack([f.get(name, np.full(n, np.nan)) for f in fs])
        have = ~np.isnan(x)
        x0 = np.where(have, x, 0.0)
        if name in dict(QUANTILES):
            w = np.vstack([f.get("rate", np.full(n, np.nan)) for f in fs])
            w = np.where(have & ~np.isnan(w), w, 0.0)
            out[name] = div((x0 * w).sum(axis=0), w.sum(axis=0))
        elif name in means:
            out[name] = div(x0.sum(axis=0), have.sum(axis=0).astype(np.float64))
        else:
            out[name] = np.where(have.any(axis=0), x0.sum(axis=0), np.nan)
    return out


def table(
    schema: pa.Schema,
    g: Grid,
    key_names: tuple[str, ...],
    rows: Iterable[tuple[tuple[str | None, ...], Mapping[str, np.ndarray], np.ndarray]],
) -> pa.Table:
    """``(key values, column -> values per window, mask)`` -> ``schema``, one row per window
    in the mask; NaN and missing columns become null. Sorted by window, then key."""
    starts = g.starts()
    values = [f for f in schema if f.name != "ts_ns" and f.name not in key_names]
    ts: list[np.ndarray] = []
    keys: list[list[np.ndarray]] = [[] for _ in key_names]
    cols: dict[str, list[np.ndarray]] = defaultdict(list)
    for key, fields, mask in rows:
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            continue
        ts.append(starts[idx])
        for i, kv in enumerate(key):
            keys[i].append(np.full(idx.size, kv, dtype=object))
        for f in values:
            arr = fields.get(f.name)
            cols[f.name].append(arr[idx] if arr is not None else np.full(idx.size, np.nan))
    if not ts:
        return schema.empty_table()
    data: dict[str, pa.Array] = {"ts_ns": pa.array(np.concatenate(ts), pa.int64())}
    for name, parts in zip(key_names, keys, strict=True):
        data[name] = pa.array(np.concatenate(parts), schema.field(name).type, from_pandas=True)
    for f in values:
        data[f.name] = pa.array(np.concatenate(cols[f.name]), from_pandas=True).cast(f.type)
    order = [("ts_ns", "ascending")] + [(k, "ascending") for k in key_names if k != "pid"]
    return pa.table(data).select(schema.names).cast(schema).sort_by(order)

"""Loader of the Alibaba GenTD26 trace (alibaba/clusterdata ``cluster-trace-v2026-GenAI``):
about 23 hours of production Stable Diffusion + LoRA serving on ~143 Kubernetes containers.

The folder holds one ``.tar.gz`` per series, each with one CSV of columns ``timestamp_anon``,
``value`` and ``container_ip`` in varying order (picked by name; macOS ``._*`` AppleDouble
members are skipped; ``qps`` adds ``request_type``). Facts this loader relies on (checked by the
profile in the issue's notes):

* every ``timestamp_anon`` (anonymised, shifted epoch seconds) lies on one 57 s grid, and no
  (container, step) pair repeats within a file: a row is the **mean over the requests or loads
  of that step** (halves and thirds occur), not one event;
* latencies and load durations are in ms, duty cycle in %, memory in bytes, QPS in an
  anonymised unit; values were scaled by the publisher, so ratios are sound, absolutes may not
  be;
* ``pipeline`` load is the sum of the component loads (base model, LoRA, ControlNet) of the
  same step, not a separate event;
* ``container_ip`` is an MD5 hash; empty, ``None`` and ``NULL`` mean the row is cluster level
  (the gateway's ``queue_size`` and the ``API Requests`` QPS).

:func:`load_trace` returns a :class:`Trace`: dense ``(steps, containers)`` float64 panels, NaN
where a container had no row in a step. Raises :class:`TraceError` naming the file and what is
wrong when the folder or a file is missing, a file holds no CSV, or a CSV lacks a column.
"""

from __future__ import annotations

import tarfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd

from cotenant.core.errors import TraceError

STEP_S = 57
"""The trace's sampling step, anonymised seconds (24 h of minutes scaled by 0.95)."""

LOAD_KINDS = ("basemodel", "lora", "controlnet")
"""Load kinds that are events of their own; ``pipeline`` is their per-step sum."""

SERIES: dict[str, tuple[str, ...]] = {
    "e2e": ("pipeline_inference_data_anon.tar.gz",),
    "model_predict": ("model_predict_data_anon.tar.gz",),
    "queue_rt": ("queue_rt_raw_anon.tar.gz",),
    "qps": ("qps.tar.gz",),
    "duty_cycle": ("pod_gpu_duty_cycle_anon.tar.gz",),
    "gpu_memory": ("pod_gpu_memory_used_bytes_anon.tar.gz",),
    "load_basemodel": (
        "basemodel_update_latency_anon.tar.gz",
        "base_model_update_latency_anon.tar.gz",  # the name the publisher's README uses
    ),
    "load_lora": ("lora_update_latency_anon.tar.gz",),
    "load_controlnet": ("controlnet_latency_data_anon.tar.gz",),
    "load_pipeline": ("pipeline_update_latency_anon.tar.gz",),
    "queue_size": ("queue_size_raw_anon.tar.gz",),
}
"""Series name -> archive file names accepted for it (the first that exists is read).

Units: ``e2e``, ``model_predict``, ``queue_rt`` and ``load_*`` ms; ``duty_cycle`` %;
``gpu_memory`` bytes; ``qps`` anonymised requests/s (generative requests only; the container-less
``API Requests`` rows become the cluster series ``api_qps``); ``queue_size`` tasks (cluster)."""

CLUSTER_SERIES = ("queue_size", "api_qps")
COLUMNS = ("timestamp_anon", "value", "container_ip")
_MISSING_IP = ["", "None", "NULL", "none", "null", "nan", "NaN"]


@dataclass(frozen=True)
class Trace:
    """The trace on its own grid. ``panels[name]`` is float64 ``(len(ts), len(containers))``,
    NaN where the container had no row in that step; ``cluster[name]`` is ``(len(ts),)``.
    ``ts`` holds the grid's ``timestamp_anon`` seconds (int64)."""

    folder: Path
    ts: np.ndarray
    containers: tuple[str, ...]
    panels: Mapping[str, np.ndarray]
    cluster: Mapping[str, np.ndarray]

    def load(self, kind: str) -> np.ndarray:
        """The ``(steps, containers)`` load-duration panel (ms) of ``kind`` (a LOAD_KINDS
        member or ``pipeline``)."""
        return self.panels[f"load_{kind}"]

    def pools(self) -> np.ndarray:
        """Per container: ``"b"`` when it reports ControlNet loads (gateway QPS and queue
        series, slow base-model loads), ``"a"`` when it serves (e2e rows) without ControlNet
        (fast base-model switching, bimodal e2e), ``"-"`` for GPU telemetry only."""
        cn = np.isfinite(self.load("controlnet")).any(axis=0)
        serves = np.isfinite(self.panels["e2e"]).any(axis=0)
        return np.where(cn, "b", np.where(serves, "a", "-"))

    def models(self) -> list[str]:
        """Per container the model name the data supports: ``sd-pool-a`` / ``sd-pool-b``
        (``sd-idle`` for containers with GPU telemetry only)."""
        names = {"a": "sd-pool-a", "b": "sd-pool-b", "-": "sd-idle"}
        return [names[p] for p in self.pools()]


def iso(ts: float) -> str:
    """``timestamp_anon`` seconds as ISO 8601 UTC (``...Z``)."""
    return datetime.fromtimestamp(float(ts), tz=UTC).isoformat().replace("+00:00", "Z")


def default_dir() -> Path:
    """``<repo>/../shared/data/alibaba-gentd26``: where a checkout (and CI) finds the trace."""
    return Path(__file__).resolve().parents[2].parent / "shared" / "data" / "alibaba-gentd26"


def _archive(folder: Path, name: str) -> Path:
    for fname in SERIES[name]:
        if (folder / fname).is_file():
            return folder / fname
    raise TraceError(
        f"{folder / SERIES[name][0]}: missing (the {name!r} series of the GenTD26 trace)"
    )


def _read_csv(path: Path, fh: IO[bytes]) -> pd.DataFrame:
    try:
        df = pd.read_csv(
            fh, dtype={"container_ip": "string"}, keep_default_na=False, na_values=_MISSING_IP
        )
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise TraceError(f"{path}: not a readable CSV ({exc})") from exc
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(
            f"{path}: lacks column(s) {', '.join(missing)} (has {', '.join(map(str, df.columns))})"
        )
    return df


def read_series(path: Path) -> pd.DataFrame:
    """The one CSV inside the tar.gz ``path`` (skipping ``._*`` members), as a frame with at
    least ``timestamp_anon``, ``value`` (float64, NaN where not numeric) and ``container_ip``
    (string, NA where cluster level). Raises :class:`TraceError`."""
    try:
        with tarfile.open(path, "r:gz") as tf:
            members = [
                m
                for m in tf.getmembers()
                if m.isfile() and m.name.endswith(".csv") and not Path(m.name).name.startswith("._")
            ]
            if len(members) != 1:
                raise TraceError(
                    f"{path}: holds {len(members)} CSV members, expected one "
                    f"({', '.join(m.name for m in members) or 'none'})"
                )
            fh = tf.extractfile(members[0])
            if fh is None:  # pragma: no cover - isfile() members always extract
                raise TraceError(f"{path}: {members[0].name} cannot be extracted")
            df = _read_csv(path, fh)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise TraceError(f"{path}: not a readable .tar.gz ({exc})") from exc
    df["value"] = pd.to_numeric(df["value"], errors="coerce").astype("float64")
    ts = pd.to_numeric(df["timestamp_anon"], errors="coerce")
    if ts.isna().any():
        raise TraceError(f"{path}: {int(ts.isna().sum())} row(s) with a non-numeric timestamp_anon")
    df["timestamp_anon"] = ts.astype("float64")
    return df


def _frames(folder: Path, workers: int) -> dict[str, pd.DataFrame]:
    paths = {name: _archive(folder, name) for name in SERIES}
    # gzip and pandas' C parser release the GIL: the files decompress and parse in parallel
    with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
        futs = {name: ex.submit(read_series, p) for name, p in paths.items()}
        frames = {name: f.result() for name, f in futs.items()}
    qps = frames.pop("qps")
    if "request_type" in qps.columns:
        api = qps["request_type"].astype("string") == "API Requests"
        frames["qps"] = qps[~api.fillna(False)]
        frames["api_qps"] = qps[api.fillna(False)]
    else:
        frames["qps"] = qps
        frames["api_qps"] = qps.iloc[:0]
    return frames


def _steps(path_of: dict[str, Path], frames: dict[str, pd.DataFrame]) -> tuple[int, int]:
    lo = min(int(f["timestamp_anon"].min()) for f in frames.values() if len(f))
    hi = max(int(f["timestamp_anon"].max()) for f in frames.values() if len(f))
    for name, f in frames.items():
        off = ((f["timestamp_anon"].to_numpy() - lo) % STEP_S) != 0
        if off.any():
            raise TraceError(
                f"{path_of[name]}: {int(off.sum())} timestamp_anon value(s) off the {STEP_S} s "
                f"grid starting at {lo} (e.g. {f['timestamp_anon'].to_numpy()[off][0]:.0f})"
            )
    return lo, (hi - lo) // STEP_S + 1


def _panel(f: pd.DataFrame, lo: int, n: int, index: pd.Index) -> np.ndarray:  # (steps, containers)
    f = f[f["container_ip"].notna()]
    out = np.full((n, len(index)), np.nan)
    if not len(f):
        return out
    rows = ((f["timestamp_anon"].to_numpy() - lo) // STEP_S).astype(np.int64)
    cols = index.get_indexer(f["container_ip"].astype(str))
    vals = f["value"].to_numpy(dtype=np.float64)
    ok = np.isfinite(vals)
    # a (container, step) pair repeats in no file of the published trace; average if one does
    s = np.zeros_like(out)
    c = np.zeros_like(out)
    np.add.at(s, (rows[ok], cols[ok]), vals[ok])
    np.add.at(c, (rows[ok], cols[ok]), 1.0)
    np.divide(s, c, out=out, where=c > 0)
    return out


def _cluster(f: pd.DataFrame, lo: int, n: int) -> np.ndarray:
    out = np.full(n, np.nan)
    rows = ((f["timestamp_anon"].to_numpy() - lo) // STEP_S).astype(np.int64)
    vals = f["value"].to_numpy(dtype=np.float64)
    s, c = np.zeros(n), np.zeros(n)
    ok = np.isfinite(vals)
    np.add.at(s, rows[ok], vals[ok])
    np.add.at(c, rows[ok], 1.0)
    np.divide(s, c, out=out, where=c > 0)
    return out


def load_trace(folder: Path | str | None = None, *, workers: int = 4) -> Trace:
    """Read every series of the trace in ``folder`` (default :func:`default_dir`) onto one
    57 s grid. Raises :class:`TraceError` (the folder or a file missing or malformed)."""
    root = Path(folder) if folder is not None else default_dir()
    if not root.is_dir():
        raise TraceError(f"{root}: no such folder (the GenTD26 trace: one .tar.gz per series)")
    frames = _frames(root, workers)
    path_of = {name: _archive(root, name) for name in SERIES}
    path_of["api_qps"] = path_of["qps"]
    lo, n = _steps(path_of, frames)
    ips = sorted(
        set().union(
            *(set(f["container_ip"].dropna().astype(str)) for f in frames.values() if len(f))
        )
    )
    index = pd.Index(ips)
    panels = {
        name: _panel(f, lo, n, index) for name, f in frames.items() if name not in CLUSTER_SERIES
    }
    cluster = {
        "queue_size": _cluster(frames["queue_size"], lo, n),
        "api_qps": _cluster(frames["api_qps"], lo, n),
    }
    return Trace(
        folder=root,
        ts=lo + STEP_S * np.arange(n, dtype=np.int64),
        containers=tuple(ips),
        panels=panels,
        cluster=cluster,
    )

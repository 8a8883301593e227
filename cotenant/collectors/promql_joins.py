"""Joins PromQL cannot do for :class:`collectors.prometheus.PrometheusSource`: placing series
that name no GPU (by their pod's DCGM series, else ``[gpu] model_gpu``), the pods' models, and
the OR of raw clock-event-reason samples."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import numpy as np

from cotenant.collectors import promql
from cotenant.collectors.promql import GPU_BY, MAX_POINTS, Grid
from cotenant.collectors.promql_client import Fields, PromQLClient


class Joins:
    """Reads through ``api``; ``model_gpu`` / ``default_gpu`` place a model whose series name
    no GPU and whose pod has no DCGM series."""

    def __init__(
        self, api: PromQLClient, model_gpu: Mapping[str, str] | None = None, default_gpu: str = ""
    ) -> None:
        self._api = api
        self._model_gpu = dict(model_gpu or {})
        self._default_gpu = default_gpu

    def clock_reasons(self, g: Grid, sel: str = "") -> dict[tuple[str, str], np.ndarray]:
        """(host, gpu) -> OR of the raw clock-event-reason samples in each window (NaN where
        none). Raw samples, because PromQL has no bitwise OR over time."""
        bits: dict[tuple[str, str], np.ndarray] = {}
        seen: dict[tuple[str, str], np.ndarray] = {}
        for c in range(0, g.n, MAX_POINTS):
            lo, hi = g.w0 + c * g.step, g.w0 + min(g.n, c + MAX_POINTS) * g.step
            for labels, ts, vals in self._api.at(
                promql.clock_reasons_query(promql.duration(hi - lo), sel), hi
            ):
                ident = tuple(labels.get(b, "") for b in GPU_BY)
                key = (promql.host_of(ident), promql.gpu_of(ident))
                k = (ts - g.w0 - 1) // g.step  # (w, w + step], as the range queries see it
                ok = ~np.isnan(vals) & (k >= 0) & (k < g.n)
                acc = bits.setdefault(key, np.zeros(g.n, np.int64))
                np.bitwise_or.at(acc, k[ok], vals[ok].astype(np.int64))
                seen.setdefault(key, np.zeros(g.n, bool))[k[ok]] = True
        return {key: np.where(seen[key], v, np.nan) for key, v in bits.items()}

    def pod_gpus(self, g: Grid) -> dict[tuple[str, str], str]:
        """(namespace, pod) -> the GPU its DCGM series name (the first, when several)."""
        found: dict[tuple[str, str], list[str]] = defaultdict(list)
        query = promql.pod_gpus_query(promql.duration(g.end - g.w0))
        for labels, _ in self._api.instant(query, g.end):
            pod = (labels.get("namespace", ""), labels.get("pod", ""))
            found[pod].append(labels.get("UUID") or labels.get("gpu", ""))
        return {pod: sorted(gpus)[0] for pod, gpus in found.items()}

    def pod_models(self, g: Grid) -> dict[tuple[str, str], str]:
        """(namespace, pod) -> the model its serving series name."""
        query = promql.pod_models_query(promql.duration(g.end - g.w0))
        return {
            (lb.get("namespace", ""), lb.get("pod", "")): lb.get("model_name") or lb["model"]
            for lb, _ in self._api.instant(query, g.end)
            if lb.get("model_name") or lb.get("model")
        }

    def place(
        self, keyed: Iterable[tuple[tuple[str, ...], Fields]], g: Grid
    ) -> dict[tuple[str, str], list[Fields]]:
        """(model, own gpu, namespace, pod) identities -> (model, gpu), in the order of the
        module docstring; identities without a model are dropped."""
        keyed = [(ident, f) for ident, f in keyed if ident[0]]
        pods = self.pod_gpus(g) if any(i[3] and not i[1] for i, _ in keyed) else {}
        out: dict[tuple[str, str], list[Fields]] = defaultdict(list)
        for (mdl, own, ns, pod), f in keyed:
            dev = own or pods.get((ns, pod)) or self._model_gpu.get(mdl, self._default_gpu)
            out[(mdl, dev)].append(f)
        return out

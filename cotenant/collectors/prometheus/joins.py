"""Joins PromQL cannot do for :class:`collectors.prometheus.source.PrometheusSource`: placing series
that name no GPU (by their pod's DCGM series, else ``[gpu] model_gpu``), the pods' models and
their DCGM rows, and the OR of raw clock-event-reason samples."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from cotenant.collectors.prometheus import engines, promql
from cotenant.collectors.prometheus.client import Fields, PromQLClient
from cotenant.collectors.prometheus.engines import MODEL
from cotenant.collectors.prometheus.frames import windows_with_data
from cotenant.collectors.prometheus.promql import EXPORTED_POD, GPU_BY, MAX_POINTS, POD_BY, Grid

log = logging.getLogger(__name__)

_INSTANCE = GPU_BY.index("instance")


def exporters_own(idents: Sequence[Sequence[str]]) -> set[int]:
    """Which of ``idents`` (:data:`GPU_BY` + :data:`POD_BY` label values) are a DCGM
    exporter's own series scraped with ``honor_labels: false``: Prometheus then names the
    workload's pod ``exported_pod`` and puts the exporter's own pod in ``pod``, so a series of
    such a scrape target (``instance``) without ``exported_pod`` names the exporter, not a
    workload. Returns their indexes."""
    at = len(GPU_BY) + EXPORTED_POD
    renamed = {i[_INSTANCE] for i in idents if i[at]}
    return {n for n, i in enumerate(idents) if i[_INSTANCE] in renamed and not i[at]}


class Joins:
    """Reads through ``api``; ``model_gpu`` / ``default_gpu`` place a model whose series name
    no GPU and whose pod has no DCGM series."""

    def __init__(
        self, api: PromQLClient, model_gpu: Mapping[str, str] | None = None, default_gpu: str = ""
    ) -> None:
        self._api = api
        self._model_gpu = dict(model_gpu or {})
        self._default_gpu = default_gpu
        self._warned_exported = False

    def _warn_exported(self, idents: Sequence[Sequence[str]]) -> None:
        """Once: say that a DCGM exporter is scraped with ``honor_labels: false``."""
        at = len(GPU_BY) + EXPORTED_POD
        if self._warned_exported or not any(i[at] for i in idents):
            return
        self._warned_exported = True
        log.warning(
            "DCGM series carry exported_pod / exported_namespace: Prometheus scrapes the "
            "exporter with honor_labels false (the dcgm-exporter chart's ServiceMonitor "
            "default), so `pod` names the exporter. cotenant reads the exported_* labels; set "
            "honorLabels: true on that ServiceMonitor (serviceMonitor.honorLabels in the "
            "chart's values) to keep the workloads' labels as they are"
        )

    def clock_reasons(self, g: Grid, sel: str = "") -> dict[tuple[str, str], np.ndarray]:
        """(host, gpu) -> OR of the raw clock-event-reason samples in each window (NaN where
        none). Raw samples, because PromQL has no bitwise OR over time. A GPU without the
        bitmask takes the reasons of :data:`promql.CLOCK_EVENTS_COUNT` samples above 0: a
        reason seen within that series' own window (5 min by default) before the sample."""
        # per source (0: the bitmask, 1: the counts): key -> (bits, windows with a sample)
        found: tuple[dict[tuple[str, str], tuple[np.ndarray, np.ndarray]], ...] = ({}, {})
        for c in range(0, g.n, MAX_POINTS):
            lo, hi = g.w0 + c * g.step, g.w0 + min(g.n, c + MAX_POINTS) * g.step
            for labels, ts, vals in self._api.at(
                promql.clock_reasons_query(promql.duration(hi - lo), sel), hi
            ):
                ident = tuple(labels.get(b, "") for b in GPU_BY)
                key = (promql.host_of(ident), promql.gpu_of(ident))
                counts = labels.get("__name__") == promql.CLOCK_EVENTS_COUNT
                if counts:  # the reason's bit where the count is above 0, else none
                    bit = promql.CLOCK_EVENT_BITS.get(labels.get("clock_event", ""), 0)
                    vals = np.where(vals > 0, float(bit), np.where(np.isnan(vals), np.nan, 0.0))
                k = (ts - g.w0 - 1) // g.step  # (w, w + step], as the range queries see it
                ok = ~np.isnan(vals) & (k >= 0) & (k < g.n)
                acc, seen = found[counts].setdefault(
                    key, (np.zeros(g.n, np.int64), np.zeros(g.n, bool))
                )
                np.bitwise_or.at(acc, k[ok], vals[ok].astype(np.int64))
                seen[k[ok]] = True
        merged = found[1] | found[0]  # the bitmask wins where a GPU has it
        return {key: np.where(seen, v, np.nan) for key, (v, seen) in merged.items()}

    def pod_gpus(self, g: Grid) -> dict[tuple[str, str], str]:
        """(namespace, pod) -> the GPU its DCGM series name (the first, when several)."""
        found: dict[tuple[str, str], list[str]] = defaultdict(list)
        query = promql.pod_gpus_query(promql.duration(g.end - g.w0))
        answer = self._api.instant(query, g.end)
        idents = [tuple(lb.get(b, "") for b in GPU_BY + POD_BY) for lb, _ in answer]
        self._warn_exported(idents)
        own = exporters_own(idents)
        for n, (labels, _) in enumerate(answer):
            name = None if n in own else promql.pod_of(idents[n][len(GPU_BY) :])
            if name is not None:
                dev = labels.get("UUID") or labels.get("uuid") or labels.get("gpu", "")
                found[(name.namespace, name.pod)].append(dev)
        return {pod: sorted(gpus)[0] for pod, gpus in found.items()}

    def pod_models(self, g: Grid) -> dict[tuple[str, str], str]:
        """(namespace, pod) -> the model its serving series name."""
        query = engines.pod_models_query(promql.duration(g.end - g.w0))
        found = (
            ((lb.get("namespace", ""), lb.get("pod", "")), model)
            for lb, _ in self._api.instant(query, g.end)
            if (model := lb.get(MODEL) or lb.get("model_name") or lb.get("model"))
        )
        return dict(found)

    def pod_rows(
        self, g: Grid, gpu: str | None, window: str, named: set[tuple[str, str]]
    ) -> list[tuple[tuple[Any, ...], Fields, np.ndarray]]:
        """PROCESS_WINDOWS rows (key, fields, windows with data) of the DCGM series labelled
        with a pod, on GPUs whose series name two pods or more, but for the (GPU, process name)
        pairs in ``named`` (those agents' series give); see
        :mod:`collectors.prometheus.source`, PROCESS_WINDOWS."""
        by = GPU_BY + POD_BY
        blocks: dict[tuple[str, ...], Fields] = {}
        for sel in promql.gpu_selectors(gpu):
            query = promql.dcgm_query(promql.PROCESS_FIELDS, by, sel, window, promql.POD_SERIES)
            blocks = self._api.blocks(query, g, by)
            if blocks:
                break
        pods: dict[tuple[str, str], set[str]] = defaultdict(set)
        rows = []
        idents = list(blocks)
        self._warn_exported(idents)
        own = exporters_own(idents)
        for n, (ident, f) in enumerate(blocks.items()):
            if n in own:
                continue
            dev, pod = promql.gpu_of(ident), promql.pod_of(ident[len(GPU_BY) :])
            if pod is not None and (gpu is None or dev == gpu):
                host = promql.host_of(ident)
                pods[(host, dev)].add(f"{pod.namespace}/{pod.pod}")
                rows.append((host, dev, pod, f))
        # one pod per GPU (dcgm-exporter without KUBERNETES_VIRTUAL_GPUS): the values are the
        # GPU's, labelled with the pod it was allocated to, whoever uses it: no pod's own
        rows = [r for r in rows if len(pods[(r[0], r[1])]) > 1 and (r[1], str(r[2])) not in named]
        models = self.pod_models(g) if rows else {}
        return [
            (
                (host, dev, None, str(pod), models.get((pod.namespace, pod.pod))),
                f,
                windows_with_data(f),
            )
            for host, dev, pod, f in rows
        ]

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

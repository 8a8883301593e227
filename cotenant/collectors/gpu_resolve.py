"""Which GPU served a request.

Order (DESIGN.md): the span's ``cotenant.gpu``; else the process (``host``, ``process.pid``
from the span's resource, or vLLM's ``vllm.process_id``) found in NVML's per-GPU process list,
else the one GPU its descendant processes run on (below); else the GPU of the processes
of the span resource's Kubernetes container, else pod (``k8s.*`` attributes joined with the
pods NVML's processes are in, when that is one GPU); else the configured model -> GPU map; else
the configured default (``""`` = unknown).

Which model a process serves, likewise: the one spans with its ``process.pid`` name, else the
one spans from its container name (the last seen), else from its pod when they name only one.
So a model's GPU process that sends no spans itself (vLLM's engine core: its ``llm_request``
spans come from the API-server process, without ``process.pid``) is labelled with the model
through its pod, and analysis treats it as the model, never as its co-tenant. A pod whose spans
name two models (two containers, or one serving several) labels its processes of an unnamed
container with neither.

Outside Kubernetes the same happens through the process tree: the procfs collector reports the
descendants of every pid spans named (:meth:`GpuResolver.set_families`; vLLM's API server ->
``EngineCore`` -> ``Worker_0``, which holds the GPU), and a descendant that spans do not name
serves its ancestor's model. Only pids from span resources without ``k8s.*`` attributes root a
family: a pod's pids are in the pod's PID namespace, not the host's the collector reads.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from cotenant.collectors.procfs.pod_identity import PodRef

MAX_FAMILY = 64
"""Descendants one span pid may lend its model to: a serving engine's tree is a handful of
processes (API server, engine cores, workers, compile helpers); a pid with more is taken for a
pid from another namespace that happens to name a host daemon, and lends nothing."""

MAX_SPAN_PODS = 4096
"""Pods (containers) remembered from span resources; past it they are forgotten all at once and
learnt again from the next spans (short-lived pods would otherwise pile up)."""


class GpuResolver:
    """Thread-safe map of (host, pid) -> GPU fed by the NVML collector, plus static fallbacks.

    It also records (host, pid) -> model as spans reveal it, so the NVML collector can label
    per-process samples with the model they serve.
    """

    def __init__(self, model_gpu: Mapping[str, str] | None = None, default_gpu: str = "") -> None:
        self._model_gpu = dict(model_gpu or {})
        self._default = default_gpu
        self._pid_gpu: dict[tuple[str, int], str] = {}
        self._pid_model: dict[tuple[str, int], str] = {}
        self._roots: set[tuple[str, int]] = set()  # span pids that may root a family
        self._family: dict[tuple[str, int], int] = {}  # (host, descendant) -> its root pid
        self._span_pods: dict[PodRef, str] = {}
        self._pod_models: dict[tuple[str, ...], set[str]] = {}  # PodRef keys -> models
        self._pid_pod: dict[tuple[str, int], PodRef] = {}
        self._pod_pids: dict[tuple[str, ...], set[tuple[str, int]]] = {}
        self._lock = threading.Lock()

    def set_process_gpu(self, host: str, pid: int, gpu: str) -> None:
        """Record that ``pid`` on ``host`` runs on ``gpu`` (from NVML's process list)."""
        with self._lock:
            self._pid_gpu[(host, pid)] = gpu

    def forget_process(self, host: str, pid: int) -> None:
        with self._lock:
            self._pid_gpu.pop((host, pid), None)
            self._family.pop((host, pid), None)
            ref = self._pid_pod.pop((host, pid), None)
            for key in () if ref is None else (*ref.container_keys(), *ref.pod_keys()):
                pids = self._pod_pids.get(key)
                if pids is not None:
                    pids.discard((host, pid))
                    if not pids:
                        del self._pod_pids[key]

    def set_process_pod(self, host: str, pid: int, ref: PodRef) -> None:
        """Record that ``pid`` on ``host`` runs in the pod ``ref`` (from its cgroup), so that
        spans naming that pod but no pid find its GPU."""
        with self._lock:
            if self._pid_pod.get((host, pid)) == ref:
                return
            self._pid_pod[(host, pid)] = ref
            for key in (*ref.container_keys(), *ref.pod_keys()):
                self._pod_pids.setdefault(key, set()).add((host, pid))

    def note_pod(self, ref: PodRef, model: str) -> None:
        """Remember that the pod (container) of a span's resource serves ``model``. Cheap
        when nothing changed: it runs for every root span naming a pod."""
        if self._span_pods.get(ref) == model:
            return
        with self._lock:
            if len(self._span_pods) >= MAX_SPAN_PODS:  # pods come and go: relearn from spans
                self._span_pods.clear()
                self._pod_models.clear()
            self._span_pods[ref] = model
            for key in ref.container_keys():
                self._pod_models[key] = {model}  # a container: the last model named wins
            for key in ref.pod_keys():
                self._pod_models.setdefault(key, set()).add(model)

    def model_of_pod(self, ref: PodRef) -> str | None:
        """The model spans named for ``ref``'s container, else for its pod when they named
        only one; None when neither is known."""
        with self._lock:
            for key in (*ref.container_keys(), *ref.pod_keys()):
                models = self._pod_models.get(key)
                if models is not None and len(models) == 1:
                    return next(iter(models))
        return None

    def note_model(self, host: str, pid: int, model: str, *, family: bool = True) -> None:
        """Remember which model a process serves (from a span's resource). ``family``: its
        descendants serve it too (False for a pid of a pod's namespace)."""
        key = (host, pid)
        if self._pid_model.get(key) != model or (family and pid > 1 and key not in self._roots):
            with self._lock:
                self._pid_model[key] = model
                if family and pid > 1:  # pid 1 is every process's ancestor
                    self._roots.add(key)

    def model_of(self, host: str, pid: int) -> str | None:
        """The model spans named for ``pid``, else for the ancestor whose family it is in."""
        key = (host, pid)
        model = self._pid_model.get(key)
        if model is None:
            root = self._family.get(key)
            if root is not None:
                model = self._pid_model.get((host, root))
        return model

    def served_pids(self, hosts: tuple[str, ...]) -> dict[int, str]:
        """pid -> model of every process on one of ``hosts`` that spans have named (``""``
        is the host of spans without ``host.name``), and of their known descendants."""
        with self._lock:
            items = list(self._pid_model.items())
            family = list(self._family.items())
        out = {pid: model for (host, pid), model in items if host in hosts}
        for (host, pid), root in family:
            model = self._pid_model.get((host, root))
            if host in hosts and model is not None:
                out.setdefault(pid, model)
        return out

    def family_roots(self, hosts: tuple[str, ...]) -> set[int]:
        """The pids on ``hosts`` whose descendants serve their model (see the module
        docstring): what :meth:`set_families` wants the descendants of."""
        with self._lock:
            return {pid for host, pid in self._roots if host in hosts}

    def set_families(self, hosts: tuple[str, ...], family: Mapping[int, int]) -> None:
        """Replace what is known of the descendants on ``hosts``: ``family`` maps each
        descendant pid to the root pid (from :meth:`family_roots`) it descends from; a root
        with more than :data:`MAX_FAMILY` descendants is left out. Descendants spans named
        themselves keep their own model."""
        sizes: dict[int, int] = {}
        for root in family.values():
            sizes[root] = sizes.get(root, 0) + 1
        with self._lock:
            for key in [k for k in self._family if k[0] in hosts]:
                del self._family[key]
            for host in hosts:
                for pid, root in family.items():
                    if (host, root) in self._roots and sizes[root] <= MAX_FAMILY:
                        self._family[(host, pid)] = root

    def resolve(
        self,
        span_gpu: str | None,
        host: str,
        pid: int | None,
        model: str,
        pod: PodRef | None = None,
    ) -> str:
        """The GPU of a request, in the order of the module docstring."""
        if span_gpu:
            return span_gpu
        if pid is not None:
            gpu = self._pid_gpu.get((host, pid))
            if gpu is None and self._family:
                gpu = self._gpu_of_family(host, pid)
            if gpu is not None:
                return gpu
        if pod is not None and self._pod_pids:
            gpu = self._gpu_of_pod(pod)
            if gpu is not None:
                return gpu
        return self._model_gpu.get(model, self._default)

    def _gpu_of_family(self, host: str, pid: int) -> str | None:
        """The one GPU the descendants of ``pid`` run on; None when none or several."""
        with self._lock:
            kin = [p for (h, p), root in self._family.items() if h == host and root == pid]
            gpus = {self._pid_gpu.get((host, p)) for p in kin} - {None}
        return gpus.pop() if len(gpus) == 1 else None

    def _gpu_of_pod(self, ref: PodRef) -> str | None:
        """The one GPU the processes of ``ref``'s container (else pod) run on; None when
        they run on none or on several."""
        with self._lock:
            for key in (*ref.container_keys(), *ref.pod_keys()):
                gpus = {self._pid_gpu.get(p) for p in self._pod_pids.get(key, ())} - {None}
                if len(gpus) == 1:
                    return gpus.pop()
                if gpus:
                    return None  # several GPUs (tensor parallel): none of them is the answer
        return None

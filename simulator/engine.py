"""The discrete-event engine: requests through CPU, locks, batching, PCIe and SMs.

Virtual time in seconds from 0. :meth:`Simulation.run_until` advances; completed requests and
counter samples accumulate in column buffers that :meth:`Simulation.take_requests` and
:meth:`Simulation.take_samples` drain — so the same engine serves whole-run output files and
paced streaming.

Per request: arrival -> preprocess on the shared host CPU pool (waiting for a core counts as
preprocess) -> named locks in order (waiting is ``lock_wait``, holding counts as preprocess)
-> the model's batch queue (dynamic batching: max batch, max wait; one batch in flight per
model) -> H2D transfer -> kernel -> D2H transfer -> postprocess.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

import numpy as np

from simulator.admission import Admission, TokenBucket
from simulator.arrivals import model_arrivals
from simulator.fluid import INF, Fluid, GpuState, Job, kernel_policy
from simulator.scenario import CLOCK_REASON_BITS, Gpu, Model, Scenario
from store.errors import UsageError

# event kinds
(
    _CLOSED,
    _LOCK,
    _ENQUEUE,
    _TIMER,
    _FLUID,
    _SAMPLE,
    _FSTART,
    _FEND,
    _HOG,
    _POST,
    _H2D,
    _D2H,
    _ADMIT,
) = range(13)
GIB = 1024**3
MB_TO_GB = 1e-3
NVLINK_GBPS = 450.0  # one direction, H100-class
HOST_IDLE_CORES = 0.05  # what an idle host process shows


class _Lock:
    __slots__ = ("free_at", "holder", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.free_at = 0.0
        self.holder = ""


class _ModelState:
    __slots__ = (
        "adm",
        "busy",
        "gpu",
        "idx",
        "locks",
        "m",
        "pid",
        "priority",
        "queue",
        "timer_at",
        "weight",
    )

    def __init__(self, idx: int, m: Model, gpu: int, locks: list[_Lock], pid: int) -> None:
        self.idx = idx
        self.m = m
        self.gpu = gpu
        self.locks = locks
        self.queue: deque[int] = deque()
        self.busy = False
        self.timer_at = -1.0
        self.priority = m.priority  # changed at run time by set_priority
        self.weight = 2.0**m.priority
        self.pid = pid
        self.adm = Admission()


class _Gpu:
    __slots__ = (
        "acc",
        "bytes_rx",
        "bytes_tx",
        "d2h_free",
        "extra_mem_gib",
        "h2d_free",
        "idx",
        "kern",
        "proc_jobs",
        "spec",
        "state",
    )

    def __init__(self, idx: int, spec: Gpu) -> None:
        self.idx = idx
        self.spec = spec
        self.state = GpuState()
        self.acc = [0.0, 0.0]  # busy seconds, DRAM-busy seconds
        self.bytes_tx = 0.0  # GB device -> host in the sample period
        self.bytes_rx = 0.0  # GB host -> device
        self.proc_jobs: dict[int, Job] = {}
        self.extra_mem_gib: dict[str, float] = {}
        self.kern: Fluid
        self.h2d_free = 0.0  # copy engines: FIFO, one DMA at a time per direction
        self.d2h_free = 0.0


class Simulation:
    """One run of a scenario. ``start_ns`` maps virtual time 0 onto wall-clock nanoseconds."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        start_ns: int = 1_767_225_600_000_000_000,
        model_pids: dict[str, int] | None = None,
    ) -> None:
        s = scenario
        self.s = s
        self.start_ns = start_ns
        self.t = 0.0
        self._heap: list[tuple[float, int, int, Any, Any]] = []
        self._seq = 0
        self._gpu_index = {g.id: i for i, g in enumerate(s.gpus)}
        self.gpus = [_Gpu(i, g) for i, g in enumerate(s.gpus)]
        locks: dict[str, _Lock] = {}
        pids = model_pids or {}
        self.models: list[_ModelState] = []
        for i, m in enumerate(s.models):
            ml = [locks.setdefault(lk.name, _Lock(lk.name)) for lk in m.locks]
            self.models.append(
                _ModelState(i, m, self._gpu_index[m.gpu], ml, pids.get(m.name, 1000 + i))
            )
        self.locks = locks
        self._proc_index = {p.name: i for i, p in enumerate(s.processes)}
        # (gpu, owner) -> [SM-share seconds, DRAM seconds] in the current sample period
        self._proc_acc: dict[tuple[int, int], list[float]] = {}
        for g in self.gpus:
            self._make_servers(g)
        # host CPU pool: a heap of core free times
        self._cores = [0.0] * max(1, s.host_cpus)
        # requests (parallel lists, index = request id)
        self._r_model: list[int] = []
        self._r_arr: list[float] = []
        self._r_pre: list[float] = []
        self._r_lockw: list[float] = []
        self._r_lockname: list[str | None] = []
        self._r_holder: list[str | None] = []
        self._r_ready: list[float] = []
        self._r_gw: list[float] = []  # seconds waiting for an admission token
        self._r_scale: list[float] = []
        self._r_tok: list[tuple[int, int]] = []
        self._out: dict[str, list[Any]] = {k: [] for k in _REQ_COLS}
        self._samples: list[tuple[Any, ...]] = []
        self._psamples: list[tuple[Any, ...]] = []
        self._batch_seq = 0
        self._closed_rng = np.random.default_rng([s.seed, 99_999])
        self._active_faults: set[int] = set()
        self._cpu_s = [0.0] * len(s.models)  # host CPU seconds per model this period
        self._cpu_hogs: dict[str, float] = {}  # target -> cores taken by a cpu_hog
        self._bw_hogs: dict[str, tuple[str, float]] = {}  # target -> (resource, level)
        self._model_bg: dict[int, Job] = {}
        # open-loop arrivals, merged across models
        parts = [model_arrivals(s, i) for i in range(len(s.models))]
        times = np.concatenate([p[0] for p in parts]) if parts else np.empty(0)
        which = (
            np.concatenate([np.full(len(p[0]), i) for i, p in enumerate(parts)])
            if parts
            else np.empty(0, dtype=np.int64)
        )
        order = np.argsort(times, kind="stable")
        self._a_t = times[order].tolist()
        self._a_m = which[order].astype(np.int64).tolist()
        self._a_scale = np.concatenate([p[1] for p in parts])[order].tolist() if parts else []
        self._a_ctx = np.concatenate([p[2] for p in parts])[order].tolist() if parts else []
        self._a_gen = np.concatenate([p[3] for p in parts])[order].tolist() if parts else []
        self._a_i = 0
        for i, m in enumerate(s.models):
            if m.arrival.kind == "closed":
                for c in range(m.arrival.concurrency):
                    self._push(c * 1e-6, _CLOSED, i, None)
        for fi, f in enumerate(s.faults):
            self._push(f.start_s, _FSTART, fi, None)
            self._push(f.end_s, _FEND, fi, None)
        for pi, p in enumerate(s.processes):
            if p.always_active and p.gpu is not None:
                self._push(0.0, _FSTART, -1 - pi, None)
        self._push(s.sample_period_s, _SAMPLE, None, None)
        self._last_sample = 0.0

    # -- plumbing ---------------------------------------------------------------------------

    def _push(self, t: float, kind: int, a: Any, b: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b))

    def _schedule_fluid(self, t: float, fluid: Fluid, job: Job) -> None:
        if t != INF:
            self._push(t, _FLUID, (fluid, job), job.version)

    def _make_servers(self, g: _Gpu) -> None:
        spec = g.spec

        def acc_kernel(dt: float, jobs: list[Job]) -> None:
            if jobs:
                g.acc[0] += dt
                g.acc[1] += dt * min(
                    1.0,
                    sum(j.dram * j.share if spec.sharing == "timeslice" else j.dram for j in jobs)
                    + g.state.dram_hog,
                )
                for j in jobs:
                    a = self._proc_acc.setdefault((g.idx, j.owner), [0.0, 0.0])
                    a[0] += dt * j.share
                    a[1] += dt * j.dram * (j.share if spec.sharing == "timeslice" else 1.0)
            elif g.state.dram_hog:
                g.acc[1] += dt * g.state.dram_hog

        g.kern = Fluid(kernel_policy(spec.sharing), g.state, self._schedule_fluid, acc_kernel)

    def _pcie_gbps(self, g: _Gpu) -> float:
        """Copy-engine bandwidth one way, less a PCIe hog and background copies."""
        full = g.spec.type.pcie_gbps
        bg = sum(self.s.processes[-1 - o].pcie_gbps for o in g.proc_jobs)
        return max(0.02 * full, full * (1 - g.state.pcie_hog) - bg)

    def _copy(self, t: float, g: _Gpu, gb: float, h2d: bool) -> float:
        """Queue a DMA of ``gb`` on the copy engine of one direction; returns its end."""
        free = g.h2d_free if h2d else g.d2h_free
        start = free if free > t else t
        end = start + gb / self._pcie_gbps(g)
        if h2d:
            g.h2d_free = end
            g.bytes_rx += gb
        else:
            g.d2h_free = end
            g.bytes_tx += gb
        return end

    # -- main loop --------------------------------------------------------------------------

    def run_until(self, t_end: float) -> None:
        """Process every event up to virtual time ``t_end`` (capped at the duration)."""
        t_end = min(t_end, self.s.duration_s)
        heap = self._heap
        a_t, a_i, n_a = self._a_t, self._a_i, len(self._a_t)
        while True:
            ta = a_t[a_i] if a_i < n_a else INF
            th = heap[0][0] if heap else INF
            if ta <= th:
                if ta > t_end:
                    break
                self.t = ta
                m = self._a_m[a_i]
                self._arrive(m, ta, self._a_scale[a_i], self._a_ctx[a_i], self._a_gen[a_i])
                a_i += 1
                continue
            if th > t_end:
                break
            t, _, kind, a, b = heapq.heappop(heap)
            self.t = t
            if kind == _FLUID:
                fluid, job = a
                if job.version == b:
                    self._fluid_done(t, fluid, job)
            elif kind == _ENQUEUE:
                self._enqueue(t, a)
            elif kind == _LOCK:
                self._take_locks(t, a)
            elif kind == _TIMER:
                ms = self.models[a]
                if ms.timer_at == t:
                    ms.timer_at = -1.0
                    if not ms.busy and ms.queue:
                        self._launch(t, ms)
            elif kind == _H2D:
                self._start_kernel(t, a)
            elif kind == _D2H:
                self._d2h_done(t, a)
            elif kind == _POST:
                self._finish(t, a)
            elif kind == _SAMPLE:
                self._sample(t)
                self._push(t + self.s.sample_period_s, _SAMPLE, None, None)
            elif kind == _CLOSED:
                self._arrive(a, t, 1.0, -1, -1, closed=True)
            elif kind == _ADMIT:
                self._enter(a, t, *b)
            elif kind == _FSTART:
                self._fault(t, a, True)
            elif kind == _FEND:
                self._fault(t, a, False)
            elif kind == _HOG:
                self._hog(t, a)
        self._a_i = a_i
        self.t = t_end

    def run(self) -> None:
        self.run_until(self.s.duration_s)

    # -- actuation: what a gateway in front of the models changes at run time ---------------

    def _model(self, name: str) -> _ModelState:
        for ms in self.models:
            if ms.m.name == name:
                return ms
        known = ", ".join(ms.m.name for ms in self.models)
        raise UsageError(f"no model {name!r} in scenario {self.s.name!r} (models: {known})")

    def set_rate_limit(
        self, model: str, rate_rps: float | None, burst: int = 1, *, max_wait_s: float = 0.0
    ) -> None:
        """From now (virtual time ``t``) admit ``model``'s requests through a token bucket of
        ``rate_rps`` and ``burst`` (full at first); ``rate_rps=None`` removes the limit.
        Requests finding no token wait up to ``max_wait_s`` (deferred), else are refused.
        Raises UsageError for an unknown model or values out of range."""
        ms = self._model(model)
        ms.adm.bucket = (
            None
            if rate_rps is None
            else TokenBucket(rate_rps, burst, max_wait_s=max_wait_s, t=self.t)
        )

    def set_priority(self, model: str, priority: int) -> None:
        """From now, ``model``'s kernels weigh ``2**priority`` against co-runners (the
        scenario's ``priority`` semantics: higher gets more of the GPU); kernels in flight are
        re-weighted at once. Raises UsageError for an unknown model."""
        if int(priority) != priority:
            raise UsageError(f"priority {priority!r} must be an integer")
        ms = self._model(model)
        ms.priority = int(priority)
        ms.weight = 2.0**ms.priority
        g = self.gpus[ms.gpu]
        mine = [j for j in g.kern.jobs if j.owner == ms.idx]
        for j in mine:
            j.weight = ms.weight
        if mine:
            g.kern.changed(self.t)

    def admission(self, model: str) -> dict[str, Any]:
        """``model``'s current limit and priority and its admission counts so far:
        ``rate_rps``, ``burst``, ``max_wait_s`` (None when unlimited), ``priority``,
        ``admitted_total``, ``deferred_total``, ``rejected_total``."""
        ms = self._model(model)
        b = ms.adm.bucket
        return {
            "rate_rps": None if b is None else b.rate_rps,
            "burst": None if b is None else b.burst,
            "max_wait_s": None if b is None else b.max_wait_s,
            "priority": ms.priority,
            "admitted_total": ms.adm.admitted,
            "deferred_total": ms.adm.deferred,
            "rejected_total": ms.adm.rejected,
        }

    def arrival_times(self, model: str) -> np.ndarray:
        """Virtual times (s) of ``model``'s open-loop arrivals over the whole run (offered
        load, before admission), sorted; empty for a closed-loop model."""
        idx = self._model(model).idx
        t = np.asarray(self._a_t)
        return t[np.asarray(self._a_m, dtype=np.int64) == idx] if len(t) else t

    def rejected_times(self, model: str) -> list[float]:
        """Virtual times (s) at which ``model``'s requests were refused, in order."""
        return list(self._model(model).adm.rejected_at)

    # -- request path -----------------------------------------------------------------------

    def _arrive(
        self, mi: int, t: float, scale: float, ctx: int, gen: int, *, closed: bool = False
    ) -> None:
        """A request reaches the model's admission point (its token bucket, when limited)."""
        wait = self.models[mi].adm.admit(t, must_wait=closed)
        if wait is None:  # refused (never for a closed-loop client: it waits)
            return
        if wait > 0:
            self._push(t + wait, _ADMIT, mi, (t, scale, ctx, gen))
        else:
            self._enter(mi, t, t, scale, ctx, gen)

    def _enter(self, mi: int, t: float, arrived: float, scale: float, ctx: int, gen: int) -> None:
        """An admitted request (``arrived`` earlier when it waited for a token) starts."""
        ms = self.models[mi]
        m = ms.m
        rid = len(self._r_model)
        self._r_model.append(mi)
        self._r_arr.append(arrived)
        self._r_gw.append(t - arrived)
        self._r_scale.append(scale)
        self._r_tok.append((ctx, gen))
        done = t
        if m.preprocess_ms > 0:
            core = heapq.heappop(self._cores)
            start = core if core > t else t
            done = start + m.preprocess_ms / 1000.0
            heapq.heappush(self._cores, done)
            self._cpu_s[mi] += m.preprocess_ms / 1000.0
        self._r_pre.append(done - t)
        self._r_lockw.append(0.0)
        self._r_lockname.append(None)
        self._r_holder.append(None)
        self._r_ready.append(done)
        if ms.locks:
            if done > t:
                self._push(done, _LOCK, rid, None)
            else:
                self._take_locks(t, rid)
        elif done > t:
            self._push(done, _ENQUEUE, rid, None)
        else:
            self._enqueue(t, rid)

    def _take_locks(self, t: float, rid: int) -> None:
        ms = self.models[self._r_model[rid]]
        cur = t
        wait_total = 0.0
        longest = -1.0
        for lk, spec in zip(ms.locks, ms.m.locks, strict=True):
            acquire = lk.free_at if lk.free_at > cur else cur
            wait = acquire - cur
            if wait > longest and wait > 0:
                longest = wait
                self._r_lockname[rid] = lk.name
                self._r_holder[rid] = lk.holder
            wait_total += wait
            lk.free_at = acquire + spec.hold_ms / 1000.0
            lk.holder = ms.m.name
            cur = lk.free_at
        self._r_lockw[rid] = wait_total
        self._r_pre[rid] += (cur - t) - wait_total
        self._r_ready[rid] = cur
        if cur > t:
            self._push(cur, _ENQUEUE, rid, None)
        else:
            self._enqueue(t, rid)

    def _enqueue(self, t: float, rid: int) -> None:
        ms = self.models[self._r_model[rid]]
        ms.queue.append(rid)
        if ms.busy:
            return
        b = ms.m.batching
        if len(ms.queue) >= b.max_batch or b.max_wait_ms <= 0:
            self._launch(t, ms)
        elif ms.timer_at < 0:
            ms.timer_at = self._r_ready[ms.queue[0]] + b.max_wait_ms / 1000.0
            self._push(ms.timer_at, _TIMER, ms.idx, None)

    def _launch(self, t: float, ms: _ModelState) -> None:
        b = ms.m.batching
        n = min(b.max_batch, len(ms.queue))
        rids = [ms.queue.popleft() for _ in range(n)]
        ms.busy = True
        ms.timer_at = -1.0
        self._batch_seq += 1
        # [model, rids, launch, h2d_end, kernel_end, d2h_end, kernel job work]
        batch = [ms.idx, rids, t, t, t, t, self._batch_seq]
        g = self.gpus[ms.gpu]
        h2d = ms.m.transfer.h2d_mb * n * MB_TO_GB
        if h2d > 0:
            self._push(self._copy(t, g, h2d, True), _H2D, batch, None)
        else:
            self._start_kernel(t, batch)

    def _start_kernel(self, t: float, batch: list[Any]) -> None:
        ms = self.models[batch[0]]
        batch[3] = t
        k = ms.m.kernel
        work = (k.base_ms + k.per_item_ms * sum(self._r_scale[r] for r in batch[1])) / 1000.0
        work *= self._preemption_factor(ms, batch[6])
        g = self.gpus[ms.gpu]
        g.kern.add(
            t, Job(work, ms.idx, ms.weight, batch, k.sm_demand, k.dram_demand, k.memory_bound)
        )

    def _preemption_factor(self, ms: _ModelState, seq: int) -> float:
        """Memory pressure: a model with a KV cache recomputes (x2 kernel time) with
        probability overflow / kv_cache when the GPU's memory is over-committed."""
        m = ms.m
        if m.kv_cache_gib <= 0:
            return 1.0
        g = self.gpus[ms.gpu]
        over = self._mem_used_gib(g) - g.spec.type.memory_gib
        if over <= 0:
            return 1.0
        p = min(1.0, over / m.kv_cache_gib)
        # deterministic per batch so counterfactual runs stay aligned
        u = ((seq * 2654435761 + ms.idx * 40503) % 1_000_003) / 1_000_003
        return 2.0 if u < p else 1.0

    def _fluid_done(self, t: float, fluid: Fluid, job: Job) -> None:
        fluid.remove(t, job)
        batch = job.batch
        if batch is None:
            return
        ms = self.models[batch[0]]
        batch[4] = t
        d2h = ms.m.transfer.d2h_mb * len(batch[1]) * MB_TO_GB
        if d2h > 0:
            self._push(self._copy(t, self.gpus[ms.gpu], d2h, False), _D2H, batch, None)
        else:
            self._d2h_done(t, batch)

    def _d2h_done(self, t: float, batch: list[Any]) -> None:
        batch[5] = t
        ms = self.models[batch[0]]
        ms.busy = False
        post = ms.m.postprocess_ms / 1000.0
        if post > 0:
            self._push(t + post, _POST, batch, None)
        else:
            self._finish(t, batch)
        if ms.queue:
            b = ms.m.batching
            oldest = self._r_ready[ms.queue[0]]
            if len(ms.queue) >= b.max_batch or t - oldest >= b.max_wait_ms / 1000.0:
                self._launch(t, ms)
            elif ms.timer_at < 0:
                ms.timer_at = oldest + b.max_wait_ms / 1000.0
                self._push(ms.timer_at, _TIMER, ms.idx, None)

    def _finish(self, t: float, batch: list[Any]) -> None:
        mi, rids, launch, h2d_end, k_end, d2h_end, _ = batch
        ms = self.models[mi]
        m = ms.m
        o = self._out
        n = len(rids)
        gpu_id = self.s.gpus[ms.gpu].id
        base = self.start_ns
        for r in rids:
            arr = self._r_arr[r]
            o["ts_start_ns"].append(base + int(arr * 1e9))
            o["ts_end_ns"].append(base + int(t * 1e9))
            o["latency_ms"].append((t - arr) * 1000.0)
            o["model"].append(m.name)
            o["tenant"].append(m.tenant or None)
            o["pid"].append(ms.pid)
            o["gpu"].append(gpu_id)
            o["priority"].append(ms.priority)
            o["batch_size"].append(n)
            ctx, gen = self._r_tok[r]
            o["prompt_tokens"].append(ctx if ctx >= 0 else None)
            o["output_tokens"].append(gen if gen >= 0 else None)
            o["queue_ms"].append((launch - self._r_ready[r] + self._r_gw[r]) * 1000.0)
            o["lock_wait_ms"].append(self._r_lockw[r] * 1000.0)
            o["preprocess_ms"].append(self._r_pre[r] * 1000.0)
            o["h2d_ms"].append((h2d_end - launch) * 1000.0)
            o["compute_ms"].append((k_end - h2d_end) * 1000.0)
            o["d2h_ms"].append((d2h_end - k_end) * 1000.0)
            o["postprocess_ms"].append((t - d2h_end) * 1000.0)
            o["lock_name"].append(self._r_lockname[r])
            o["lock_holder"].append(self._r_holder[r])
            o["rid"].append(r)
        if m.arrival.kind == "closed":
            think = m.arrival.think_ms / 1000.0
            for _ in rids:
                self._push(t + think, _CLOSED, mi, None)

    # -- faults -----------------------------------------------------------------------------

    def _mem_used_gib(self, g: _Gpu) -> float:
        used = sum(ms.m.memory_gib + ms.m.kv_cache_gib for ms in self.models if ms.gpu == g.idx)
        for o in g.proc_jobs:
            used += self.s.processes[-1 - o].memory_gib
        return used + sum(g.extra_mem_gib.values())

    def _fault(self, t: float, fi: int, start: bool) -> None:
        if fi < 0:  # an always-active process
            self._process(t, -1 - fi, start)
            return
        f = self.s.faults[fi]
        if start:
            self._active_faults.add(fi)
        else:
            self._active_faults.discard(fi)
        if f.kind == "process_active":
            if f.target in self._proc_index:
                self._process(t, self._proc_index[f.target], start)
            else:
                self._model_background(t, f.target, start)
        elif f.kind == "bandwidth_hog":
            g = self._target_gpu(f.target)
            if g is not None:
                if start:
                    self._bw_hogs[f.target] = (f.resource, f.level)
                else:
                    self._bw_hogs.pop(f.target, None)
                if f.resource == "pcie":
                    g.state.pcie_hog = f.level if start else 0.0
                elif f.resource == "nvlink":
                    # single-GPU serving does not use NVLink: visible in counters only
                    g.state.nvlink_hog = f.level if start else 0.0
                else:
                    g.state.dram_hog = f.level if start else 0.0
                    g.kern.changed(t)
        elif f.kind == "throttle":
            g = self.gpus[self._gpu_index[f.gpu]]
            g.state.clock_factor = f.clock_factor if start else 1.0
            g.state.reasons = CLOCK_REASON_BITS.get(f.reason, 0) if start else 0
            g.kern.changed(t)
        elif f.kind == "memory_pressure":
            g = self._target_gpu(f.target)
            if g is not None:
                if start:
                    g.extra_mem_gib[f.target] = g.extra_mem_gib.get(f.target, 0.0) + f.gib
                else:
                    g.extra_mem_gib[f.target] = g.extra_mem_gib.get(f.target, 0.0) - f.gib
        elif f.kind == "cpu_hog":
            if start:
                self._cpu_hogs[f.target] = self._cpu_hogs.get(f.target, 0.0) + f.cores
            else:
                self._cpu_hogs[f.target] = self._cpu_hogs.get(f.target, 0.0) - f.cores
            if start:
                cores = sorted(self._cores)
                k = min(f.cores, len(cores) - 1)
                for i in range(k):
                    cores[i] = max(cores[i], f.end_s)
                heapq.heapify(cores)
                self._cores = cores
        elif f.kind == "lock_hog" and start:
            self._push(t, _HOG, fi, None)
        # cotenant_burst and load_surge are extra arrivals generated up front

    def _target_gpu(self, name: str) -> _Gpu | None:
        if name in self._proc_index:
            gid = self.s.processes[self._proc_index[name]].gpu
            return None if gid is None else self.gpus[self._gpu_index[gid]]
        for ms in self.models:
            if ms.m.name == name:
                return self.gpus[ms.gpu]
        return None

    def _process(self, t: float, pi: int, start: bool) -> None:
        p = self.s.processes[pi]
        if p.gpu is None:
            return
        g = self.gpus[self._gpu_index[p.gpu]]
        owner = -1 - pi
        if start and owner not in g.proc_jobs:
            job = Job(INF, owner, 1.0, None, p.sm_demand, p.dram_demand, 0.0)
            g.proc_jobs[owner] = job
            if p.sm_demand > 0 or p.dram_demand > 0:
                g.kern.add(t, job)
        elif not start and owner in g.proc_jobs:
            job = g.proc_jobs.pop(owner)
            if job in g.kern.jobs:
                g.kern.remove(t, job)

    def _model_background(self, t: float, name: str, start: bool) -> None:
        """``process_active`` aimed at a model: its process loads the GPU like a kernel that
        never ends (e.g. a warm-up or an offline job in the same process)."""
        ms = next((x for x in self.models if x.m.name == name), None)
        if ms is None:
            return
        g = self.gpus[ms.gpu]
        if start and ms.idx not in self._model_bg:
            k = ms.m.kernel
            job = Job(INF, ms.idx, ms.weight, None, k.sm_demand, k.dram_demand, 0.0)
            self._model_bg[ms.idx] = job
            g.kern.add(t, job)
        elif not start and ms.idx in self._model_bg:
            g.kern.remove(t, self._model_bg.pop(ms.idx))

    def _hog(self, t: float, fi: int) -> None:
        f = self.s.faults[fi]
        if fi not in self._active_faults:
            return
        lk = self.locks[f.lock]
        acquire = lk.free_at if lk.free_at > t else t
        lk.free_at = acquire + f.hold_ms / 1000.0
        lk.holder = f.holder
        # hog the lock 80 % of the time while the fault lasts
        self._push(lk.free_at + f.hold_ms / 4000.0, _HOG, fi, None)

    # -- counters ---------------------------------------------------------------------------

    def _sample(self, t: float) -> None:
        period = t - self._last_sample
        if period <= 0:
            return
        ts = self.start_ns + int(t * 1e9)
        host = self.s.host
        for g in self.gpus:
            g.kern.advance(t)
            spec = g.spec.type
            sm = min(1.0, g.acc[0] / period)
            mem = min(1.0, g.acc[1] / period)
            clock = spec.max_sm_clock_mhz * g.state.clock_factor
            bg = sum(self.s.processes[-1 - o].pcie_gbps for o in g.proc_jobs)
            hog = g.state.pcie_hog * spec.pcie_gbps
            tx = (g.bytes_tx / period + bg + hog) * 1e9
            rx = (g.bytes_rx / period + bg + hog) * 1e9
            reasons = g.state.reasons | (CLOCK_REASON_BITS["gpu_idle"] if sm == 0 else 0)
            power = (
                spec.idle_power_w
                + (spec.max_power_w - spec.idle_power_w) * sm * g.state.clock_factor
            )
            used = min(self._mem_used_gib(g), spec.memory_gib) * GIB
            nvl = g.state.nvlink_hog * NVLINK_GBPS * 1e9 if g.state.nvlink_hog else None
            self._samples.append(
                (
                    ts,
                    host,
                    g.spec.id,
                    sm * 100.0,
                    mem * 100.0,
                    mem,
                    tx,
                    rx,
                    nvl,
                    nvl,
                    int(used),
                    int(spec.memory_gib * GIB),
                    power,
                    35.0 + 45.0 * sm,
                    clock,
                    spec.max_sm_clock_mhz,
                    reasons,
                )
            )
            g.acc[0] = g.acc[1] = 0.0
            g.bytes_tx = g.bytes_rx = 0.0
            for ms in self.models:
                if ms.gpu != g.idx:
                    continue
                a = self._proc_acc.pop((g.idx, ms.idx), [0.0, 0.0])
                mem_b = int(
                    (ms.m.memory_gib + ms.m.kv_cache_gib + g.extra_mem_gib.get(ms.m.name, 0.0))
                    * GIB
                )
                self._psamples.append(
                    (
                        ts,
                        host,
                        g.spec.id,
                        ms.pid,
                        ms.m.name,
                        ms.m.name,
                        min(100.0, a[0] / period * 100.0),
                        min(100.0, a[1] / period * 100.0 + self._hog_mem_util(ms.m.name, g)),
                        mem_b,
                        self._cpu_s[ms.idx] / period + self._cpu_hogs.get(ms.m.name, 0.0),
                    )
                )
            for pi, p in enumerate(self.s.processes):
                if p.gpu != g.spec.id:
                    continue
                owner = -1 - pi
                a = self._proc_acc.pop((g.idx, owner), [0.0, 0.0])
                hog = self._hog_mem_util(p.name, g)
                if owner not in g.proc_jobs and a == [0.0, 0.0] and not hog:
                    continue
                self._psamples.append(
                    (
                        ts,
                        host,
                        g.spec.id,
                        p.pid,
                        p.name,
                        None,
                        min(100.0, a[0] / period * 100.0),
                        min(100.0, a[1] / period * 100.0 + hog),
                        int(p.memory_gib * GIB),
                        self._cpu_hogs.get(p.name) or None,
                    )
                )
        for ms in self.models:
            self._cpu_s[ms.idx] = 0.0
        for p in self.s.processes:
            if p.gpu is None:  # host-only processes: their CPU use is all that shows
                cores = self._cpu_hogs.get(p.name, 0.0)
                self._psamples.append(
                    (ts, host, None, p.pid, p.name, None, None, None, None, cores + HOST_IDLE_CORES)
                )
        self._last_sample = t

    def _hog_mem_util(self, name: str, g: _Gpu) -> float:
        """Memory-controller load (percent) a bandwidth hog puts on its own process's counters:
        its DRAM level, or for a PCIe copy loop the DRAM traffic of the copies."""
        hog = self._bw_hogs.get(name)
        if hog is None:
            return 0.0
        resource, level = hog
        if resource == "dram":
            return level * 100.0
        t = g.spec.type
        return min(100.0, level * 2 * t.pcie_gbps / t.dram_gbps * 100.0)

    # -- output -----------------------------------------------------------------------------

    def take_requests(self) -> dict[str, list[Any]]:
        """Completed requests since the last call, as columns (see ``_REQ_COLS``)."""
        out = self._out
        self._out = {k: [] for k in _REQ_COLS}
        return out

    def take_samples(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """(gpu sample rows, process sample rows) since the last call, in store column order."""
        g, p = self._samples, self._psamples
        self._samples, self._psamples = [], []
        return g, p


_REQ_COLS = (
    "ts_start_ns",
    "ts_end_ns",
    "latency_ms",
    "model",
    "tenant",
    "pid",
    "gpu",
    "priority",
    "batch_size",
    "prompt_tokens",
    "output_tokens",
    "queue_ms",
    "lock_wait_ms",
    "preprocess_ms",
    "h2d_ms",
    "compute_ms",
    "d2h_ms",
    "postprocess_ms",
    "lock_name",
    "lock_holder",
    "rid",
)

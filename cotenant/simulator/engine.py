"""The discrete-event engine: requests through CPU, locks, batching, PCIe and SMs.

Virtual time in seconds from 0. :meth:`Simulation.run_until` advances; completed requests and
counter samples accumulate in column buffers that :meth:`Simulation.take_requests` and
:meth:`Simulation.take_samples` drain — so the same engine serves whole-run output files and
paced streaming.

Per request: arrival -> preprocess on the shared host CPU pool (waiting for a core counts as
preprocess) -> named locks in order (waiting is ``lock_wait``, holding counts as preprocess)
-> the model's batch queue (dynamic batching: max batch, max wait; one batch in flight per
model) -> H2D transfer -> kernel -> D2H transfer -> postprocess. A model with replicas has one
queue and batcher per replica, on the replica's GPU; after admission its route
(:mod:`simulator.routing`) picks the replica of each request. What actions change at run time
(limits, priorities, weights) is in :mod:`simulator.controls`.

Each :class:`~simulator.events.EventKind` has one handler here, dispatched through a table.
What faults do lives in :mod:`simulator.faults`, the counters in :mod:`simulator.sampling`,
the run-time state in :mod:`simulator.state` and request timings in
:mod:`simulator.request_log`.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable
from typing import Any

from cotenant.simulator.arrivals import MergedArrivals, merged_arrivals
from cotenant.simulator.controls import RunControls
from cotenant.simulator.decode import DecodePool, token_counts
from cotenant.simulator.events import EventKind, EventQueue
from cotenant.simulator.faults import FaultEffects
from cotenant.simulator.fluid import INF, Fluid, Job, kernel_policy
from cotenant.simulator.request_log import RequestLog
from cotenant.simulator.routing import Route
from cotenant.simulator.sampling import Row, Sampler
from cotenant.simulator.scenario import Scenario
from cotenant.simulator.state import (
    MB_TO_GB,
    Batch,
    HogLoad,
    HostCpus,
    SimGpu,
    SimLock,
    SimModel,
    background_pcie_gbps,
)

Handler = Callable[[float, Any, Any], None]
"""An event handler: ``(t, a, b)`` with the payload its :class:`EventKind` documents."""


class Simulation:
    """One run of a scenario. ``start_ns`` maps virtual time 0 onto wall-clock nanoseconds;
    ``model_pids`` overrides the pid of a model (default ``1000 + index``)."""

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
        self._events = EventQueue()
        gpu_index = {g.id: i for i, g in enumerate(s.gpus)}
        self.gpus = [SimGpu(i, g) for i, g in enumerate(s.gpus)]
        locks: dict[str, SimLock] = {}
        pids = model_pids or {}
        self.models: list[SimModel] = []  # one per replica (one per model without replicas)
        self.routes: list[Route] = []  # by model index in the scenario
        for i, m in enumerate(s.models):
            ml = [locks.setdefault(lk.name, SimLock(lk.name)) for lk in m.locks]
            pid = pids.get(m.name, 1000 + i)
            if not m.replicas:
                self.models.append(SimModel(len(self.models), m, gpu_index[m.gpu], ml, pid))
                self.routes.append(Route(m.routing, self.models[-1:], [1], ""))
                continue
            first = len(self.models)
            for j, r in enumerate(m.replicas):
                self.models.append(
                    SimModel(
                        len(self.models),
                        m,
                        gpu_index[r.gpu],
                        ml,
                        pid if j == 0 else r.pid,
                        model_idx=i,
                        replica=r.name,
                        adm=self.models[first].adm if j else None,
                    )
                )
            weights = [r.weight for r in m.replicas]
            self.routes.append(Route(m.routing, self.models[first:], weights, f"{s.seed}:{m.name}"))
        self.locks = locks
        for f in s.faults:  # a model swap or adapter churn blocks every replica of its target
            for ms in self.models:
                if ms.m.name == f.target:
                    ms.loads = sorted([*ms.loads, *f.load_times()])
        self._cpus = HostCpus(s.host_cpus)
        hogs = HogLoad()
        faults = FaultEffects(s, self.gpus, self.models, locks, self._cpus, hogs, self._events)
        self._faults = faults
        self._sampler = Sampler(s, start_ns, self.gpus, self.models, hogs)
        for g in self.gpus:
            g.kern = Fluid(
                kernel_policy(g.spec.sharing),
                g.state,
                self._schedule_kernel,
                self._sampler.kernel_accounting(g),
            )
        self._requests = RequestLog(start_ns)
        # LLM models (an ``llm`` section) decode in a continuous batch: model index -> pool
        self._pools: dict[int, DecodePool] = {}
        for ms in self.models:
            if ms.m.llm is not None:
                self._pools[ms.idx] = DecodePool(
                    ms, ms.m.llm, self.gpus[ms.gpu].kern, self._decoded
                )
        self._batch_seq = 0
        self._seq_batch: dict[int, tuple[Batch, int]] = {}  # decoding rid -> (prefill, batch)
        self._arrivals = merged_arrivals(s)
        self._a_i = 0
        self.controls = RunControls(self)
        """Rate limits, priorities and replica weights at run time (:mod:`simulator.controls`)."""
        handlers: dict[EventKind, Handler] = {
            EventKind.CLOSED_ARRIVAL: lambda t, m, _: self._arrive(m, t, 1.0, -1, -1, closed=True),
            EventKind.LOCKS: self._take_locks,
            EventKind.ENQUEUE: self._enqueue,
            EventKind.BATCH_TIMER: self._batch_timer,
            EventKind.KERNEL_DONE: self._kernel_done,
            EventKind.SAMPLE: self._sample,
            EventKind.FAULT_START: lambda t, fi, _: faults.start(t, fi),
            EventKind.FAULT_END: lambda t, fi, _: faults.end(t, fi),
            EventKind.LOCK_HOG: lambda t, fi, _: faults.lock_hog_tick(t, fi),
            EventKind.POSTPROCESS_DONE: self._finish,
            EventKind.H2D_DONE: self._start_kernel,
            EventKind.D2H_DONE: self._d2h_done,
            EventKind.ADMITTED: lambda t, mi, req: self._enter(mi, t, *req),
        }
        # indexed by kind (values 0..n-1); a kind without a handler fails here, not mid-run
        self._handlers = tuple(handlers[k] for k in sorted(EventKind))
        push = self._events.push
        for i, m in enumerate(s.models):
            if m.arrival.kind == "closed":
                for c in range(m.arrival.concurrency):
                    push(c * 1e-6, EventKind.CLOSED_ARRIVAL, i)
        for fi, f in enumerate(s.faults):
            push(f.start_s, EventKind.FAULT_START, fi)
            push(f.end_s, EventKind.FAULT_END, fi)
        for pi, p in enumerate(s.processes):
            if p.always_active and p.gpu is not None:
                push(0.0, EventKind.FAULT_START, -1 - pi)
        push(s.sample_period_s, EventKind.SAMPLE)

    # -- main loop --------------------------------------------------------------------------

    @property
    def arrivals(self) -> MergedArrivals:
        """Every open-loop arrival of the run (virtual times, models), sorted."""
        return self._arrivals

    def run_until(self, t_end: float) -> None:
        """Process every event up to virtual time ``t_end`` (capped at the duration)."""
        t_end = min(t_end, self.s.duration_s)
        heap = self._events.heap
        handlers = self._handlers
        arr = self._arrivals
        a_t, a_i, n_a = arr.t, self._a_i, len(arr.t)
        while True:
            ta = a_t[a_i] if a_i < n_a else INF
            th = heap[0][0] if heap else INF
            if ta <= th:
                if ta > t_end:
                    break
                self.t = ta
                self._arrive(arr.model[a_i], ta, arr.scale[a_i], arr.ctx[a_i], arr.gen[a_i])
                a_i += 1
                continue
            if th > t_end:
                break
            t, _, kind, a, b = heapq.heappop(heap)
            self.t = t
            handlers[kind](t, a, b)
        self._a_i = a_i
        self.t = t_end

    def run(self) -> None:
        self.run_until(self.s.duration_s)

    # -- event handlers ---------------------------------------------------------------------

    def _batch_timer(self, t: float, mi: int, _: object = None) -> None:
        ms = self.models[mi]
        if ms.timer_at == t:  # else superseded by a launch
            ms.timer_at = -1.0
            if not ms.busy and ms.queue:
                self._launch(t, ms)

    def _kernel_done(self, t: float, fj: tuple[Fluid, Job], version: int) -> None:
        fluid, job = fj
        if job.version == version:  # else its rate changed and a later event stands
            self._fluid_done(t, fluid, job)

    def _sample(self, t: float, _a: object = None, _b: object = None) -> None:
        self._sampler.sample(t)
        self._events.push(t + self.s.sample_period_s, EventKind.SAMPLE)

    # -- request path -----------------------------------------------------------------------

    def _arrive(
        self, mi: int, t: float, scale: float, ctx: int, gen: int, *, closed: bool = False
    ) -> None:
        """A request reaches the model's admission point (its token bucket, when limited)."""
        wait = self.routes[mi].members[0].adm.admit(t, must_wait=closed)
        if wait is None:  # refused (never for a closed-loop client: it waits)
            return
        if wait > 0:
            self._events.push(t + wait, EventKind.ADMITTED, mi, (t, scale, ctx, gen))
        else:
            self._enter(mi, t, t, scale, ctx, gen)

    def _enter(self, mi: int, t: float, arrived: float, scale: float, ctx: int, gen: int) -> None:
        """An admitted request of model ``mi`` (``arrived`` earlier when it waited for a
        token) is routed to a replica and starts there."""
        ms = self.routes[mi].pick()
        ms.in_flight += 1
        m = ms.m
        done = t
        if m.preprocess_ms > 0:
            done = self._cpus.run(t, m.preprocess_ms / 1000.0)
            ms.cpu_s += m.preprocess_ms / 1000.0
        rid = self._requests.admit(ms.idx, t, arrived, scale, ctx, gen, done)
        if ms.locks:
            if done > t:
                self._events.push(done, EventKind.LOCKS, rid)
            else:
                self._take_locks(t, rid)
        elif done > t:
            self._events.push(done, EventKind.ENQUEUE, rid)
        else:
            self._enqueue(t, rid)

    def _take_locks(self, t: float, rid: int, _: object = None) -> None:
        req = self._requests
        ms = self.models[req.model[rid]]
        cur = t
        wait_total = 0.0
        longest = -1.0
        for lk, spec in zip(ms.locks, ms.m.locks, strict=True):
            acquire = lk.free_at if lk.free_at > cur else cur
            wait = acquire - cur
            if wait > longest and wait > 0:
                longest = wait
                req.lock_name[rid] = lk.name
                req.lock_holder[rid] = lk.holder
            wait_total += wait
            lk.free_at = acquire + spec.hold_ms / 1000.0
            lk.holder = ms.m.name
            cur = lk.free_at
        req.lock_wait[rid] = wait_total
        req.preprocess[rid] += (cur - t) - wait_total
        req.ready[rid] = cur
        if cur > t:
            self._events.push(cur, EventKind.ENQUEUE, rid)
        else:
            self._enqueue(t, rid)

    def _enqueue(self, t: float, rid: int, _: object = None) -> None:
        ms = self.models[self._requests.model[rid]]
        ms.queue.append(rid)
        if ms.busy:
            return
        b = ms.m.batching
        if len(ms.queue) >= b.max_batch or b.max_wait_ms <= 0:
            self._launch(t, ms)
        elif ms.timer_at < 0:
            ms.timer_at = self._requests.ready[ms.queue[0]] + b.max_wait_ms / 1000.0
            self._events.push(ms.timer_at, EventKind.BATCH_TIMER, ms.idx)

    def _launch(self, t: float, ms: SimModel) -> None:
        if ms.loads and self._blocked(t, ms):
            return
        b = ms.m.batching
        n = min(b.max_batch, len(ms.queue))
        pool = self._pools.get(ms.idx) if self._pools else None
        if pool is not None:
            # the decode batch is full: new prefills wait for a sequence to finish
            n = min(n, pool.room)
            if n <= 0:
                return
        rids = [ms.queue.popleft() for _ in range(n)]
        if ms.loads:
            self._requests.waited_for_loads(rids, t, ms.loads)
        ms.busy = True
        ms.timer_at = -1.0
        self._batch_seq += 1
        batch = Batch(ms.idx, rids, t, self._batch_seq)
        g = self.gpus[ms.gpu]
        h2d = ms.m.transfer.h2d_mb * n * MB_TO_GB
        if h2d > 0:
            self._events.push(
                g.copy(t, h2d, True, background_pcie_gbps(g, self.s.processes)),
                EventKind.H2D_DONE,
                batch,
            )
        else:
            self._start_kernel(t, batch)

    def _blocked(self, t: float, ms: SimModel) -> bool:
        """A load runs on ``ms`` at ``t``: its batches wait, a timer launches them when it
        ends (``model_load`` faults)."""
        i = bisect.bisect_right(ms.loads, (t, INF)) - 1
        if i < 0 or ms.loads[i][1] <= t:
            return False
        end = ms.loads[i][1]
        if ms.timer_at != end:
            ms.timer_at = end
            self._events.push(end, EventKind.BATCH_TIMER, ms.idx)
        return True

    def _start_kernel(self, t: float, batch: Batch, _: object = None) -> None:
        ms = self.models[batch.model]
        batch.h2d_end = t
        k = ms.m.kernel
        llm = ms.m.llm
        if llm is None:
            scale = self._requests.scale
            work = (k.base_ms + k.per_item_ms * sum(scale[r] for r in batch.rids)) / 1000.0
        else:  # prefill: the batch's prompt tokens
            tokens = self._requests.tokens
            for r in batch.rids:  # a closed-loop request carries no counts: the means
                tokens[r] = token_counts(llm, tokens[r])
            prompt = sum(tokens[r][0] for r in batch.rids)
            work = (
                k.base_ms + k.per_item_ms * len(batch.rids) + llm.prefill_ms_per_1k * prompt / 1000
            ) / 1000.0
        work *= self._faults.preemption_factor(ms, batch.seq)
        g = self.gpus[ms.gpu]
        g.kern.add(
            t, Job(work, ms.idx, ms.weight, batch, k.sm_demand, k.dram_demand, k.memory_bound)
        )

    def _fluid_done(self, t: float, fluid: Fluid, job: Job) -> None:
        if isinstance(job.batch, DecodePool):  # decode steps: it re-arms its own job
            job.batch.step_done(t)
            return
        fluid.remove(t, job)
        batch: Batch | None = job.batch
        if batch is None:  # a background job of a process
            return
        ms = self.models[batch.model]
        batch.kernel_end = t
        d2h = ms.m.transfer.d2h_mb * len(batch.rids) * MB_TO_GB
        if d2h > 0:
            g = self.gpus[ms.gpu]
            end = g.copy(t, d2h, False, background_pcie_gbps(g, self.s.processes))
            self._events.push(end, EventKind.D2H_DONE, batch)
        else:
            self._d2h_done(t, batch)

    def _d2h_done(self, t: float, batch: Batch, _: object = None) -> None:
        batch.d2h_end = t
        ms = self.models[batch.model]
        ms.busy = False
        post = ms.m.postprocess_ms / 1000.0
        pool = self._pools.get(ms.idx) if self._pools else None
        if pool is not None:  # first tokens out: the sequences join the decode batch
            n = pool.active + len(batch.rids)
            for r in batch.rids:
                self._seq_batch[r] = (batch, n)
            pool.join(t, batch.rids, [self._requests.tokens[r][1] - 1 for r in batch.rids])
        elif post > 0:
            self._events.push(t + post, EventKind.POSTPROCESS_DONE, batch)
        else:
            self._finish(t, batch)
        if ms.queue:
            b = ms.m.batching
            oldest = self._requests.ready[ms.queue[0]]
            if len(ms.queue) >= b.max_batch or t - oldest >= b.max_wait_ms / 1000.0:
                self._launch(t, ms)
            elif ms.timer_at < 0:
                ms.timer_at = oldest + b.max_wait_ms / 1000.0
                self._events.push(ms.timer_at, EventKind.BATCH_TIMER, ms.idx)

    def _decoded(self, t: float, rid: int) -> None:
        """An LLM request's last token is out at ``t``."""
        batch, n = self._seq_batch.pop(rid)
        ms = self.models[batch.model]
        self._requests.complete_llm(t, rid, batch, ms, self.gpus[ms.gpu].spec.id, n)
        if ms.m.arrival.kind == "closed":
            self._events.push(t + ms.m.arrival.think_ms / 1000.0, EventKind.CLOSED_ARRIVAL, ms.idx)
        if ms.queue and not ms.busy:  # room in the decode batch again
            b = ms.m.batching
            if len(ms.queue) >= b.max_batch or t - self._requests.ready[ms.queue[0]] >= (
                b.max_wait_ms / 1000.0
            ):
                self._launch(t, ms)

    def _finish(self, t: float, batch: Batch, _: object = None) -> None:
        ms = self.models[batch.model]
        self._requests.complete(t, batch, ms, self.gpus[ms.gpu].spec.id)
        ms.in_flight -= len(batch.rids)
        a = ms.m.arrival
        if a.kind == "closed":
            think = a.think_ms / 1000.0
            for _r in batch.rids:
                self._events.push(t + think, EventKind.CLOSED_ARRIVAL, ms.model_idx)

    # -- kernel servers ---------------------------------------------------------------------

    def _schedule_kernel(self, t: float, fluid: Fluid, job: Job) -> None:
        if t != INF:
            self._events.push(t, EventKind.KERNEL_DONE, (fluid, job), job.version)

    # -- output -----------------------------------------------------------------------------

    def take_requests(self) -> dict[str, list[Any]]:
        """Completed requests since the last call, as columns
        (:data:`simulator.request_log.REQUEST_COLUMNS`)."""
        return self._requests.take()

    def take_samples(self) -> tuple[list[Row], list[Row]]:
        """(gpu sample rows, process sample rows) since the last call, in store column order."""
        return self._sampler.take()

"""Host CPU use per process from procfs, into ``process_samples`` (host-level rows).

:class:`ProcfsCollector` reads ``<proc>/<pid>/stat`` of every process (at most ``max_pids``)
every ``interval_s`` and turns the change of ``utime + stime`` since its previous read into
cores (CPU seconds per second of wall time). ``process_name`` is the model's name for a process
that spans have named (:meth:`collectors.gpu_resolve.GpuResolver.served_pids`; so a model's
host CPU lines up with its requests, as in the simulator) and otherwise the program: its
``comm``, or for an interpreter (python, node, java, ...) the interpreter and its script or
module, e.g. ``python3 burn.py``; with ``pods`` (a
:class:`collectors.procfs.pod_identity.PodIdentity`) a process in a known Kubernetes pod is named
``namespace/pod (container)`` instead, or by the model spans from that pod name (their
``k8s.*`` resource attributes, :meth:`collectors.gpu_resolve.GpuResolver.model_of_pod`), as for
a pid spans named. Analysis keys host CPU series by that name, so each
poll submits one ``process_samples`` row per *name*: the cores of its processes (those using at
least ``min_cores``) summed, under the pid of the busiest. Rows go out for the ``top_n`` names
by CPU use and for every model, whatever its use. Rows are host-level, as the simulator
writes its host processes: no ``gpu`` and no GPU columns, only ``cpu_cores``.

The descendants of each process spans named (its children, theirs, ...: vLLM's ``EngineCore``
and ``Worker_N`` under its API server) serve its model too (:func:`collectors.procfs.tree.
descendants`, from each process's parent pid; :meth:`collectors.gpu_resolve.GpuResolver.
set_families`), from the next poll on, so an engine's own processes are never its co-tenants.

Each row of a poll also carries the host's CPU frequency then (``cpu_freq_mhz``, the mean over
its CPUs, and ``cpu_max_freq_mhz``, their hardware maximum: :class:`collectors.procfs.cpufreq.
CpuFrequency`, from ``<sys>/devices/system/cpu/cpu*/cpufreq/``), NULL where cpufreq is not
readable, so a clamped frequency is seen by the diagnosis (the ``cpu`` cause, culprit ``host``).

A process's first read gives no rate (and no row); a pid reused by a new process (another
start time) starts over. Cost per poll: one directory listing, one read of ``stat`` per
process and one of ``cmdline`` for each new busy process, linear in the process count, which
``max_pids`` bounds. The ``stat`` of a process seen before is re-read with ``pread`` on the
descriptor its first read opened (procfs regenerates the text at offset 0; half the syscall
cost of open + read + close): at most a quarter of ``RLIMIT_NOFILE`` such descriptors are
held, one per listed pid, closed when the pid leaves the listing or its process exits (a read
then fails with ESRCH, and a new process of that pid is opened afresh) and in :meth:`stop`.
The lines are parsed as bytes (``comm`` decoded only to name a busy process).

Failures never leave :meth:`ProcfsCollector.poll_once`: a process that exits mid-read is
skipped; anything else is counted in ``cotenant_procfs_errors_total{kind}`` and logged once
per kind; a batch the store refuses is dropped and counted in
``cotenant_procfs_dropped_rows_total``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from prometheus_client import CollectorRegistry, Counter, Gauge

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.procfs.cpufreq import CpuFrequency
from cotenant.collectors.procfs.pod_identity import PodIdentity, PodRef
from cotenant.collectors.procfs.stat import fd_budget, parse_stat_bytes, read_small
from cotenant.collectors.procfs.stat import parse_stat as parse_stat  # re-exported
from cotenant.collectors.procfs.stat import program_name as program_name  # re-exported
from cotenant.collectors.procfs.tree import descendants
from cotenant.core.errors import CotenantError
from cotenant.core.periodic import Periodic
from cotenant.store.schema import arrow_schema

log = logging.getLogger(__name__)

SCHEMA = arrow_schema("process_samples")

_Key = tuple[int, int]  # (pid, start time in clock ticks): one process, even if a pid is reused


@dataclass
class _Group:
    """The processes of one program in one poll: cores summed, the busiest one's pid."""

    cores: float
    pid: int
    pid_cores: float
    model: str | None

    def add(self, pid: int, cores: float, model: str | None) -> None:
        self.cores += cores
        if cores > self.pid_cores:
            self.pid, self.pid_cores = pid, cores
        self.model = self.model or model


class ProcfsMetrics:
    """The series the procfs collector exposes; pass it to ``ProcfsCollector(metrics=…)``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.processes = Gauge(
            "cotenant_procfs_processes",
            "Processes read in the latest procfs poll",
            registry=registry,
        )
        self.polls = Counter("cotenant_procfs_polls", "procfs polls run", registry=registry)
        self.poll_seconds = Counter(
            "cotenant_procfs_poll_seconds",
            "Wall time spent polling procfs; rate() bounds the share of a core it takes",
            registry=registry,
        )
        self.errors = Counter(
            "cotenant_procfs_errors_total",
            "procfs reads or polls that failed, by kind",
            ["kind"],
            registry=registry,
        )
        self.dropped = Counter(
            "cotenant_procfs_dropped_rows_total",
            "process_samples rows from procfs the store refused",
            registry=registry,
        )


class ProcfsCollector:
    """Samples host CPU per process; see the module docstring. Thread-safe :meth:`poll_once`."""

    def __init__(
        self,
        *,
        sink: Callable[[str, pa.Table], object],
        resolver: GpuResolver,
        host: str,
        proc: str | Path = "/proc",
        sys: str | Path = "/sys",
        metrics: ProcfsMetrics | None = None,
        clock: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
        interval_s: float = 1.0,
        top_n: int = 10,
        min_cores: float = 0.01,
        max_pids: int = 4096,
        clock_ticks: int | None = None,
        pods: PodIdentity | None = None,
        own_pid: int | None = None,
    ) -> None:
        """``proc`` and ``sys``: the procfs and sysfs roots (tests pass fake trees).
        ``clock``: what rows are stamped with (ns); ``monotonic``: what rates are measured with
        (s). ``pods``: names processes in Kubernetes pods by pod (None: by program only).
        ``own_pid``: the process never recorded, this one by default: cotenant is nobody's
        co-tenant (its own CPU follows the traffic it ingests, and in ``cotenant demo`` the
        simulated workload's: named, it would be blamed for every burst; its cost is in its
        own metrics and docs/performance.md)."""
        self._sink = sink
        self._resolver = resolver
        self.host = host
        self._hosts = (host, "") if host else ("",)
        self._proc = str(proc)
        self._freq = CpuFrequency(sys)
        self._metrics = metrics
        self._clock = clock
        self._monotonic = monotonic
        self.interval_s = interval_s
        self.top_n = top_n
        self.min_cores = min_cores
        self.max_pids = max_pids
        self._ticks = float(clock_ticks or os.sysconf("SC_CLK_TCK"))
        self._pods = pods
        self._own_pid = os.getpid() if own_pid is None else own_pid
        self._prev: dict[_Key, int] = {}  # CPU ticks at the previous read
        self._prev_t: float | None = None
        self._names: dict[_Key, tuple[str, PodRef | None]] = {}
        self._fds: dict[int, int] = {}  # pid -> open descriptor of its stat
        self._had_family = False
        self.fd_budget = min(max_pids, fd_budget())
        self._logged: set[str] = set()
        self._lock = threading.Lock()
        self._worker: Periodic | None = None

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Poll on a daemon thread every ``interval_s`` until :meth:`stop`."""
        self._worker = Periodic(
            "cotenant-procfs",
            self.interval_s,
            self.poll_once,
            what="the procfs poll",
            fixed_rate=True,
        )
        self._worker.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and close the descriptors held (a later poll reopens them)."""
        if self._worker is not None:
            self._worker.stop(timeout_s)
            self._worker = None
        with self._lock:
            self.close()

    def close(self) -> None:
        """Close the ``stat`` and cpufreq descriptors held between polls."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)
        self._freq.close()

    # ---- polling ---------------------------------------------------------------------

    def poll_once(self) -> None:
        """Read every process once and submit the rows worth recording. Never raises."""
        t0 = time.perf_counter()
        with self._lock:
            try:
                n = self._poll()
            except Exception as exc:  # a poll must never take the thread (or caller) down
                self._fail("unexpected", f"procfs poll failed: {exc!r}", exc_info=True)
                return
        if self._metrics is not None:
            self._metrics.processes.set(n)
            self._metrics.polls.inc()
            self._metrics.poll_seconds.inc(time.perf_counter() - t0)

    def _poll(self) -> int:
        now_t, ts = self._monotonic(), self._clock()
        dt = None if self._prev_t is None else now_t - self._prev_t
        rate = dt is not None and dt > 0
        served = self._resolver.served_pids(self._hosts) if rate else {}
        prev, tck, min_cores = self._prev, self._ticks, self.min_cores
        ticks: dict[_Key, int] = {}
        parents: dict[int, int] = {}
        # one row per program: analysis keys host CPU series by name, so the processes of one
        # program (8 burners, a server's workers) are summed, under the busiest one's pid
        groups: dict[str, _Group] = {}
        pids = self._pids()
        self._forget_gone(pids)
        for pid in pids:
            if pid == self._own_pid:
                continue
            try:
                comm, used, start, parents[pid] = parse_stat_bytes(self._stat(pid))
            except (FileNotFoundError, ProcessLookupError):
                continue  # exited between the listing and the read
            except (OSError, ValueError, IndexError) as exc:
                self._fail("stat", f"cannot read {self._proc}/{pid}/stat: {exc}")
                continue
            key = (pid, start)
            ticks[key] = used
            before = prev.get(key)
            if before is None or dt is None or not rate:
                continue
            c = max(0.0, (used - before) / tck / dt)
            model = served.get(pid)
            if model is None and c < min_cores:
                continue
            if model is None:
                name, pod = self._name(key, comm)
                model = None if pod is None else self._resolver.model_of_pod(pod)
                name = model or name
            else:
                name = model
            g = groups.get(name)
            if g is None:
                groups[name] = _Group(c, pid, c, model)
            else:
                g.add(pid, c, model)
        self._prev, self._prev_t = ticks, now_t
        self._names = {k: v for k, v in self._names.items() if k in ticks}  # busy ones only
        roots = self._resolver.family_roots(self._hosts)
        if roots or self._had_family:  # their descendants serve their model from the next poll
            family = descendants(parents, roots)
            self._resolver.set_families(self._hosts, family)
            self._had_family = bool(family)
        if not rate:
            return len(ticks)
        busy = sorted(
            (n for n, g in groups.items() if g.model is None), key=lambda n: -groups[n].cores
        )
        keep = busy[: self.top_n] + [n for n, g in groups.items() if g.model is not None]
        if keep:
            self._submit(ts, keep, [groups[n] for n in keep], self._frequency())
        return len(ticks)

    def _frequency(self) -> tuple[float, float] | tuple[None, None]:
        try:
            got = self._freq.read()
        except OSError as exc:
            self._fail("cpufreq", f"cannot read the CPU frequency: {exc}")
            return None, None
        return got if got is not None else (None, None)

    def _stat(self, pid: int) -> bytes:
        """The text of ``<proc>/<pid>/stat``: ``pread`` on the descriptor held for ``pid``,
        else opened (and held while the budget allows). Raises OSError as the read does;
        ProcessLookupError when the held descriptor's process exited and the pid has no
        new process."""
        fd = self._fds.get(pid)
        if fd is not None:
            try:
                return os.pread(fd, 4096, 0)
            except OSError:  # that process exited (ESRCH): the pid may be a new one's now
                del self._fds[pid]
                os.close(fd)
        path = f"{self._proc}/{pid}/stat"
        if len(self._fds) >= self.fd_budget:
            return read_small(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            raw = os.pread(fd, 4096, 0)
        except BaseException:
            os.close(fd)
            raise
        self._fds[pid] = fd
        return raw

    def _forget_gone(self, pids: list[int]) -> None:
        """Close the descriptors of pids no longer listed."""
        fds = self._fds
        if not fds:
            return
        listed = set(pids)
        for pid in [p for p in fds if p not in listed]:
            os.close(fds.pop(pid))

    def _pids(self) -> list[int]:
        # os.listdir: names only, cheaper than scandir's DirEntry per process
        pids = [int(n) for n in os.listdir(self._proc) if n.isdigit()]
        if len(pids) >= self.max_pids:
            self._fail("truncated", f"more than {self.max_pids} processes: read the first")
            del pids[self.max_pids :]
        return pids

    def _name(self, key: _Key, comm: bytes) -> tuple[str, PodRef | None]:
        """The process's name (its pod's, else its program's) and its pod."""
        known = self._names.get(key)
        if known is None:
            found = None if self._pods is None else self._pods.lookup(key[0])
            if found is None or found.name is None:
                try:
                    cmdline = read_small(f"{self._proc}/{key[0]}/cmdline")
                except OSError:
                    cmdline = b""
                name = program_name(comm.decode(errors="replace"), cmdline)
            else:
                name = found.name
            known = (name, None if found is None else found.ref)
            if found is None or found.final:  # else its pod is not listed yet: ask again
                self._names[key] = known
        return known

    def _submit(
        self,
        ts: int,
        names: list[str],
        groups: list[_Group],
        freq: tuple[float, float] | tuple[None, None],
    ) -> None:
        n = len(names)
        cols: dict[str, list[Any]] = {
            "ts_ns": [ts] * n,
            "host": [self.host] * n,
            "pid": [g.pid for g in groups],
            "process_name": names,
            "model": [g.model for g in groups],
            "cpu_cores": [g.cores for g in groups],
            "cpu_freq_mhz": [freq[0]] * n,
            "cpu_max_freq_mhz": [freq[1]] * n,
        }
        arrays = [
            pa.array(cols[f.name], type=f.type) if f.name in cols else pa.nulls(n, type=f.type)
            for f in SCHEMA
        ]
        try:
            self._sink("process_samples", pa.Table.from_arrays(arrays, schema=SCHEMA))
        except CotenantError as exc:  # writer queue full or closing: drop, count, go on
            if self._metrics is not None:
                self._metrics.dropped.inc(n)
            self._fail(
                "store", f"dropping {n} process_samples rows from procfs: {exc}", count=False
            )

    def _fail(self, kind: str, msg: str, *, exc_info: bool = False, count: bool = True) -> None:
        if count and self._metrics is not None:
            self._metrics.errors.labels(kind).inc()
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(msg, exc_info=exc_info)

"""The simulator's GPU as NVML sees it: a :class:`collectors.nvml.fake.FakeNvml` built from a
scenario and driven by the simulation's counter samples, in process or through a feed file.

In process (``cotenant demo``): :func:`fake_for` builds the FakeNvml, :func:`feed_rows` copies
each tick's ``Simulation.take_samples()`` into it, and the service's real NVML collector polls
it. Across processes (``cotenant simulate --otlp URL --nvml-feed PATH`` -> ``cotenant agent
--fake-nvml PATH``): :class:`FeedWriter` writes the same samples as JSON lines, which
:mod:`simulator.nvml_feed_tail` follows on the agent's side.

The feed file (UTF-8, one JSON object per line)::

    {"kind": "header", "version": 1, "scenario": "fleet-node-a", "host": "node-a",
     "start_ns": …, "wall_start_ns": …, "speed": 1.0,
     "gpus": [{"id": "gpu-a0", "uuid": "GPU-gpu-a0", "name": "NVIDIA H100-SXM (simulated)",
               "memory_total_bytes": …, "max_sm_clock_mhz": 1980}],
     "processes": [{"pid": 1000, "gpu": "gpu-a0", "name": "tts", "used_memory_bytes": …}]}
    {"kind": "gpu", "ts_ns": …, "gpu": "gpu-a0", "sm_util": 41.0, "mem_util": 12.5, …}
    {"kind": "process", "ts_ns": …, "pid": 1000, "sm_util": 30.2, "mem_util": 8.0,
     "used_memory_bytes": …}

Utilisation is in percent (0-100), memory in bytes, PCIe in bytes/s, power in W, temperature
in °C, clocks in MHz; ``ts_ns`` is the sample's virtual time (``start_ns`` + simulated
seconds), which the wall clock reaches at ``wall_start_ns`` + simulated seconds / ``speed``.
Only what NVML would see is written: processes on a GPU, not host-only ones. A bad header or
record raises :class:`store.errors.FeedError` naming the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from cotenant.collectors.nvml.fake import FakeNvml
from cotenant.core.errors import FeedError
from cotenant.simulator.scenario import Scenario
from cotenant.simulator.scenario_load import model_pid

FEED_VERSION = 1
GIB = 1024**3
Row = tuple[Any, ...]

# feed record field -> FakeNvml.set_gpu keyword, for the GPU counters (all numbers)
_GPU_FIELDS: dict[str, str] = {
    "sm_util": "sm_util",
    "mem_util": "mem_util",
    "memory_used_bytes": "memory_used_bytes",
    "pcie_tx_bps": "pcie_tx_bps",
    "pcie_rx_bps": "pcie_rx_bps",
    "power_w": "power_w",
    "temp_c": "temp_c",
    "sm_clock_mhz": "sm_clock_mhz",
    "clock_event_reasons": "clock_event_reasons",
}
_INT_FIELDS = {"memory_used_bytes", "clock_event_reasons", "used_memory_bytes", "pid", "ts_ns"}


def gpu_uuid(gpu_id: str) -> str:
    """The NVML UUID the simulated GPU ``gpu_id`` gets (spans name the GPU by it too)."""
    return f"GPU-{gpu_id}"


@dataclass(frozen=True)
class FeedGpu:
    id: str  # the scenario's GPU id, as the sample records name it
    uuid: str
    name: str
    memory_total_bytes: int
    max_sm_clock_mhz: int


@dataclass(frozen=True)
class FeedProcess:
    pid: int
    gpu: str  # scenario GPU id
    name: str
    used_memory_bytes: int


@dataclass(frozen=True)
class FeedHeader:
    """The first line of a feed: the GPUs and GPU processes, and how virtual time maps onto the
    wall clock (``start_ns`` at ``wall_start_ns``, ``speed`` virtual seconds per second)."""

    scenario: str
    host: str
    start_ns: int
    wall_start_ns: int
    speed: float
    gpus: tuple[FeedGpu, ...]
    processes: tuple[FeedProcess, ...]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {"kind": "header", "version": FEED_VERSION, **d}

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> FeedHeader:
        """Parse a header record; FeedError naming the field when it is not one."""
        if obj.get("kind") != "header":
            raise FeedError(f'the first line must be the header ("kind": "header"), got {obj!r}')
        if obj.get("version") != FEED_VERSION:
            raise FeedError(f"version {obj.get('version')!r}: this cotenant reads {FEED_VERSION}")
        speed = _num(obj, "speed")
        if not speed > 0:
            raise FeedError(f"speed {speed!r}: must be positive")
        gpus = tuple(
            FeedGpu(
                id=_str(g, f"gpus[{i}].id", "id"),
                uuid=_str(g, f"gpus[{i}].uuid", "uuid"),
                name=_str(g, f"gpus[{i}].name", "name"),
                memory_total_bytes=int(_num(g, "memory_total_bytes", f"gpus[{i}]")),
                max_sm_clock_mhz=int(_num(g, "max_sm_clock_mhz", f"gpus[{i}]")),
            )
            for i, g in enumerate(_list(obj, "gpus"))
        )
        ids = {g.id for g in gpus}
        procs = []
        for i, p in enumerate(_list(obj, "processes")):
            gpu = _str(p, f"processes[{i}].gpu", "gpu")
            if gpu not in ids:
                raise FeedError(f"processes[{i}].gpu {gpu!r}: not one of the header's gpus")
            procs.append(
                FeedProcess(
                    pid=int(_num(p, "pid", f"processes[{i}]")),
                    gpu=gpu,
                    name=_str(p, f"processes[{i}].name", "name"),
                    used_memory_bytes=int(_num(p, "used_memory_bytes", f"processes[{i}]")),
                )
            )
        return FeedHeader(
            scenario=_str(obj, "scenario", "scenario"),
            host=_str(obj, "host", "host"),
            start_ns=int(_num(obj, "start_ns")),
            wall_start_ns=int(_num(obj, "wall_start_ns")),
            speed=speed,
            gpus=gpus,
            processes=tuple(procs),
        )


def header_for(
    scenario: Scenario, *, start_ns: int, wall_start_ns: int, speed: float
) -> FeedHeader:
    """The GPUs of ``scenario`` and every process NVML would list on them: each model (each
    replica on its own GPU, with its own pid) and each process placed on a GPU."""
    gpus = tuple(
        FeedGpu(
            id=g.id,
            uuid=gpu_uuid(g.id),
            name=f"NVIDIA {g.type.name} (simulated)",
            memory_total_bytes=int(g.type.memory_gib * GIB),
            max_sm_clock_mhz=int(g.type.max_sm_clock_mhz),
        )
        for g in scenario.gpus
    )
    procs: list[FeedProcess] = []
    for m in scenario.models:
        mem = int((m.memory_gib + m.kv_cache_gib) * GIB)
        pid = model_pid(scenario, m.name)
        if not m.replicas:
            procs.append(FeedProcess(pid, m.gpu, m.name, mem))
        for j, r in enumerate(m.replicas):  # the first replica is the model's own process
            procs.append(FeedProcess(pid if j == 0 else r.pid, r.gpu, m.name, mem))
    procs += [
        FeedProcess(p.pid, p.gpu, p.name, int(p.memory_gib * GIB))
        for p in scenario.processes
        if p.gpu is not None
    ]
    return FeedHeader(
        scenario.name, scenario.host, start_ns, wall_start_ns, speed, gpus, tuple(procs)
    )


def add_to_fake(fake: FakeNvml, header: FeedHeader, have: Iterable[str] = ()) -> dict[str, str]:
    """Add the header's GPUs (but those whose UUID is in ``have``: a restarted feed may be
    applied again) and processes (replaced by pid) to ``fake``; returns scenario GPU id ->
    UUID."""
    have = set(have)
    for g in header.gpus:
        if g.uuid not in have:
            fake.model.add_gpu(
                name=g.name,
                memory_total_bytes=g.memory_total_bytes,
                max_sm_clock_mhz=g.max_sm_clock_mhz,
                uuid=g.uuid,
                nvlink=False,
            )
    uuids = {g.id: g.uuid for g in header.gpus}
    for p in header.processes:
        fake.model.add_process(
            uuids[p.gpu], p.pid, name=p.name, used_memory_bytes=p.used_memory_bytes
        )
    return uuids


def fake_for(scenario: Scenario, clock: Callable[[], int]) -> tuple[FakeNvml, dict[str, str]]:
    """A FakeNvml with ``scenario``'s GPUs and processes, on ``clock`` (virtual ns); returns it
    and scenario GPU id -> UUID (the names spans should carry)."""
    fake = FakeNvml(clock=clock)
    now = clock()
    return fake, add_to_fake(fake, header_for(scenario, start_ns=now, wall_start_ns=now, speed=1))


def sample_records(gpu_rows: Iterable[Row], proc_rows: Iterable[Row]) -> list[dict[str, Any]]:
    """The simulator's sample rows (store column order, ``Simulation.take_samples()``) as feed
    records: one per GPU row, one per process row NVML would report (on a GPU, with SM
    utilisation)."""
    out: list[dict[str, Any]] = []
    for row in gpu_rows:
        ts, _host, gid, sm, mem, _dram, tx, rx, _ntx, _nrx, used = row[:11]
        power, temp, clock, _max_clock, reasons = row[12:17]
        out.append(
            {
                "kind": "gpu",
                "ts_ns": int(ts),
                "gpu": gid,
                "sm_util": sm,
                "mem_util": mem,
                "memory_used_bytes": int(used),
                "pcie_tx_bps": tx,
                "pcie_rx_bps": rx,
                "power_w": power,
                "temp_c": temp,
                "sm_clock_mhz": clock,
                "clock_event_reasons": int(reasons),
            }
        )
    for row in proc_rows:
        ts, _host, gid, pid, _name, _model, sm, mem, used = row[:9]
        if gid is None or sm is None:
            continue  # a host-only process: NVML does not see it
        out.append(
            {
                "kind": "process",
                "ts_ns": int(ts),
                "pid": int(pid),
                "sm_util": sm,
                "mem_util": mem or 0.0,
                "used_memory_bytes": int(used or 0),
            }
        )
    return out


def check_record(rec: Any, uuids: Mapping[str, str]) -> dict[str, Any]:
    """A sample record, checked: FeedError naming the field when it is not one (unknown kind or
    GPU, missing or non-numeric field)."""
    if not isinstance(rec, dict):
        raise FeedError(f"expected a JSON object, got {type(rec).__name__}")
    kind = rec.get("kind")
    _num(rec, "ts_ns")
    if kind == "gpu":
        gpu = rec.get("gpu")
        if gpu not in uuids:
            raise FeedError(f"gpu {gpu!r}: not one of the header's gpus {sorted(uuids)}")
        for f in _GPU_FIELDS:
            if rec.get(f) is not None:
                _num(rec, f)
    elif kind == "process":
        for f in ("pid", "sm_util", "mem_util", "used_memory_bytes"):
            _num(rec, f)
    else:
        raise FeedError(f'kind {kind!r}: expected "gpu" or "process"')
    return rec


def apply_record(fake: FakeNvml, uuids: Mapping[str, str], rec: Mapping[str, Any]) -> None:
    """One checked record -> ``fake``: a GPU's counters are set as of now; a process's
    utilisation is recorded as the sample stamped ``ts_ns`` (NVML shows it once its clock
    reaches it), its memory set now. FeedError for a process the header did not list."""
    if rec["kind"] == "gpu":
        kw = {k: _cast(f, rec[f]) for f, k in _GPU_FIELDS.items() if rec.get(f) is not None}
        fake.model.set_gpu(uuids[rec["gpu"]], **kw)
        return
    pid = int(rec["pid"])
    try:
        fake.model.record_process_util(
            pid, rec["sm_util"], rec["mem_util"], ts_ns=int(rec["ts_ns"])
        )
        fake.model.set_process_memory(pid, int(rec["used_memory_bytes"]))
    except KeyError:
        raise FeedError(f"pid {pid}: not one of the header's processes") from None


def feed_rows(
    fake: FakeNvml, uuids: Mapping[str, str], gpu_rows: Iterable[Row], proc_rows: Iterable[Row]
) -> None:
    """Counter samples of the simulator -> the FakeNvml the collector reads (in process).
    Samples of processes the fake does not list (none, from :func:`fake_for`) are skipped."""
    for rec in sample_records(gpu_rows, proc_rows):
        try:
            apply_record(fake, uuids, rec)
        except FeedError:
            continue


class FeedWriter:
    """Writes a feed file (replacing any file at ``path``): the header now, then :meth:`write`
    per tick (flushed, so a reader following the file sees whole lines as the stream runs).
    FeedError names the path when it cannot be written."""

    def __init__(self, path: Path, header: FeedHeader) -> None:
        self.path = path
        try:
            # a new file, not the old one truncated: a reader tells a restart by the inode
            path.unlink(missing_ok=True)
            self._f: IO[str] = path.open("w", encoding="utf-8")
        except OSError as exc:
            raise FeedError(f"{path}: cannot write the NVML feed ({exc.strerror})") from exc
        self._line(header.to_json())

    def write(self, gpu_rows: Iterable[Row], proc_rows: Iterable[Row]) -> None:
        recs = sample_records(gpu_rows, proc_rows)
        if recs:
            self._f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
            self._f.flush()

    def _line(self, obj: dict[str, Any]) -> None:
        self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _cast(field: str, v: Any) -> Any:
    return int(v) if field in _INT_FIELDS else float(v)


def _num(obj: Mapping[str, Any], field: str, where: str = "") -> float:
    v = obj.get(field)
    name = f"{where}.{field}" if where else field
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise FeedError(f"{name} {v!r}: expected a finite number")
    return float(v)


def _str(obj: Mapping[str, Any], name: str, field: str) -> str:
    v = obj.get(field)
    if not isinstance(v, str) or not v:
        raise FeedError(f"{name} {v!r}: expected a non-empty string")
    return v


def _list(obj: Mapping[str, Any], field: str) -> list[Mapping[str, Any]]:
    v = obj.get(field)
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise FeedError(f"{field} {v!r}: expected a list of objects")
    return v

"""Follow a simulated-NVML feed file (:mod:`simulator.nvml_feed`) into a FakeNvml, for
``cotenant agent --fake-nvml PATH``: a simulated GPU instead of the driver, for demos and tests.

:class:`FeedTail` owns a :class:`collectors.nvml.fake.FakeNvml` (no GPU until the feed's header
arrives) and a :class:`FeedClock`; the agent's real NVML collector polls the fake on that clock.
A thread reads whatever the writer (``cotenant simulate --nvml-feed``) appended, every
``poll_s``: the header adds the GPUs and processes (and calls ``on_gpus``, so the collector
re-lists its devices at once) and maps the clock onto the stream's virtual time; a GPU record
sets the counters when the clock reaches its ``ts_ns``; a process record is recorded at once as
the sample stamped ``ts_ns`` (NVML shows it from then on).

Failure modes, none of which stops the thread or the agent: a file that does not exist yet is
waited for (logged once); a bad header, or a line that is not JSON or not a record, is logged
as ``PATH:LINE: what is wrong`` (the first 10; all are counted in :attr:`FeedTail.bad_lines`);
after a bad header the rest of that file is ignored. A file replaced or truncated (the stream
restarted) is followed from its new start.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from cotenant.collectors.nvml.fake import FakeNvml
from cotenant.core.errors import FeedError, UsageError
from cotenant.simulator.nvml_feed import FeedHeader, add_to_fake, apply_record, check_record

log = logging.getLogger(__name__)

MAX_LOGGED = 10  # bad lines logged in full; the rest are only counted
READ_BYTES = 1 << 22  # read at most this much per pass: a long feed is caught up in steps


class FeedClock:
    """The feed's virtual time in ns: the wall clock until a header maps it
    (``start_ns + (now - wall_start_ns) x speed``)."""

    def __init__(self, wall_ns: Callable[[], int] = time.time_ns) -> None:
        self._wall_ns = wall_ns
        self._map: tuple[int, int, float] = (0, 0, 1.0)

    def follow(self, header: FeedHeader) -> None:
        self._map = (header.start_ns, header.wall_start_ns, header.speed)

    def __call__(self) -> int:
        start, wall, speed = self._map  # one read: a header may replace it meanwhile
        elapsed = self._wall_ns() - wall
        return start + (elapsed if speed == 1.0 else int(elapsed * speed))


class FeedTail:
    """Drives :attr:`fake` from the feed file at ``path``; see the module docstring."""

    def __init__(
        self,
        path: Path,
        *,
        clock: FeedClock | None = None,
        poll_s: float = 0.05,
        on_gpus: Callable[[], None] | None = None,
        max_pending: int = 10_000,
    ) -> None:
        """UsageError when ``path`` is a directory or its directory does not exist (the
        file itself may appear later). At most ``max_pending`` GPU records wait for their
        time (a header whose clock never reaches them): beyond, the oldest is applied early."""
        if path.is_dir():
            raise UsageError(f"--fake-nvml {path}: a directory, not a feed file")
        if not path.parent.is_dir():
            raise UsageError(f"--fake-nvml {path}: directory {path.parent} does not exist")
        self.path = path
        self.clock = clock or FeedClock()
        self.fake = FakeNvml(clock=self.clock)
        self.on_gpus = on_gpus
        self.poll_s = poll_s
        self.max_pending = max_pending
        self.header: FeedHeader | None = None
        self.lines = 0  # lines read from the current file
        self.applied = 0  # records applied, all files
        self.bad_lines = 0
        self.applied_early = 0  # GPU records applied before their time (max_pending)
        self._uuids: dict[str, str] = {}
        self._known: set[str] = set()  # GPU UUIDs added to the fake
        self._f: BinaryIO | None = None
        self._ino: int | None = None
        self._pos = 0
        self._buf = b""
        self._dead = False  # the current file's header was bad
        self._due: deque[dict[str, Any]] = deque()  # GPU records waiting for their time
        self._waiting_logged = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """GPU records read and waiting for their time."""
        return len(self._due)

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="cotenant-nvml-feed", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._f is not None:
            self._f.close()
            self._f = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # the feed must never take the agent's NVML path down
                log.exception("fake NVML feed %s: unexpected failure; retrying", self.path)
                self._close()
            self._stop.wait(self.poll_s)

    # ---- one pass --------------------------------------------------------------------

    def step(self) -> None:
        """Read what was appended, apply the records that are due."""
        if self._reopen_needed():
            self._close()
            if not self._open():
                return
        f = self._f
        if f is None:
            return
        data = f.read(READ_BYTES)
        if data:
            self._pos += len(data)
            *lines, self._buf = (self._buf + data).split(b"\n")
            for raw in lines:
                self.lines += 1
                self._line(raw)
        now = self.clock()
        while self._due and self._due[0]["ts_ns"] <= now:
            self._apply(self._due.popleft(), None)

    def _reopen_needed(self) -> bool:
        if self._f is None:
            return True
        try:
            st = os.stat(self.path)
        except OSError:
            return False  # removed: keep what we have until a new file appears
        return st.st_ino != self._ino or st.st_size < self._pos

    def _open(self) -> bool:
        try:
            f = self.path.open("rb")
        except FileNotFoundError:
            if not self._waiting_logged:
                log.warning(
                    "fake NVML feed %s: no such file yet; no simulated GPU until "
                    "`cotenant simulate … --nvml-feed %s` writes it",
                    self.path,
                    self.path,
                )
                self._waiting_logged = True
            return False
        except OSError as exc:
            if not self._waiting_logged:
                log.error("fake NVML feed %s: cannot read it (%s)", self.path, exc.strerror)
                self._waiting_logged = True
            return False
        self._f, self._ino = f, os.fstat(f.fileno()).st_ino
        self._pos, self._buf, self.lines, self._dead = 0, b"", 0, False
        self.header = None
        self._due.clear()
        log.info("fake NVML feed %s: following it", self.path)
        return True

    def _close(self) -> None:
        if self._f is not None:
            self._f.close()
        self._f = None

    def _line(self, raw: bytes) -> None:
        if self._dead or not raw.strip():
            return
        try:
            obj = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            self._bad(f"not a JSON line ({exc})")
            return
        if self.header is None:
            try:
                self._start(FeedHeader.from_json(obj if isinstance(obj, dict) else {}))
            except FeedError as exc:
                self._dead = True
                self._bad(f"{exc}; ignoring this file until it is replaced")
            return
        try:
            rec = check_record(obj, self._uuids)
        except FeedError as exc:
            self._bad(str(exc))
            return
        if rec["kind"] == "gpu":
            self._due.append(rec)  # counters are "now" values: set them when their time comes
            if len(self._due) > self.max_pending:
                if self.applied_early == 0:
                    log.warning(
                        "fake NVML feed %s: more than %d GPU samples ahead of the clock "
                        "(is the header's wall_start_ns right?); applying the oldest early",
                        self.path,
                        self.max_pending,
                    )
                self.applied_early += 1
                self._apply(self._due.popleft(), None)
        else:
            self._apply(rec, self.lines)

    def _start(self, header: FeedHeader) -> None:
        self.header = header
        self.clock.follow(header)
        self._uuids = add_to_fake(self.fake, header, self._known)
        self._known |= set(self._uuids.values())
        log.info(
            "fake NVML feed %s: scenario %s on %s, %d GPUs, %d processes",
            self.path,
            header.scenario,
            header.host,
            len(header.gpus),
            len(header.processes),
        )
        if self.on_gpus is not None:
            self.on_gpus()

    def _apply(self, rec: dict[str, Any], line: int | None) -> None:
        try:
            apply_record(self.fake, self._uuids, rec)
            self.applied += 1
        except FeedError as exc:
            self._bad(str(exc), line)

    def _bad(self, what: str, line: int | None = None) -> None:
        self.bad_lines += 1
        if self.bad_lines <= MAX_LOGGED:
            at = f"{self.path}:{line or self.lines}"
            more = " (further bad lines are only counted)" if self.bad_lines == MAX_LOGGED else ""
            log.error("fake NVML feed %s: %s%s", at, what, more)

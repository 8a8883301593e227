"""The host's CPU frequency from sysfs cpufreq, for the procfs collector.

:class:`CpuFrequency` lists ``<sys>/devices/system/cpu/cpu<N>/cpufreq/`` once and then, per
read, the current frequency of every CPU (``scaling_cur_freq``, kHz) through a descriptor held
open (sysfs regenerates an attribute's text at offset 0, so ``pread`` re-reads it), and returns
the mean over the CPUs and the mean of their hardware maximum (``cpuinfo_max_freq``, read once;
``scaling_max_freq`` where the hardware maximum is not exposed), both in MHz. A frequency clamp
(``cpupower frequency-set -u``, a power or thermal policy, a BIOS cap) lowers the first against
the second.

Where cpufreq is absent (many virtual machines and containers without ``/sys``), :meth:`read`
returns None, and lists again only every :data:`RELIST_READS` reads. A CPU whose files vanish
(taken offline) is dropped; any other failure raises OSError to the caller, which counts it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

RELIST_READS = 60
"""Reads between two listings of the CPUs when none had cpufreq."""

_CPU = re.compile(r"cpu[0-9]+")


class CpuFrequency:
    """Mean current and maximum CPU frequency of the host (see the module doc)."""

    def __init__(self, sys: str | Path = "/sys") -> None:
        """``sys``: the sysfs root (tests pass a fake tree)."""
        self._root = Path(sys) / "devices" / "system" / "cpu"
        self._fds: list[int] = []
        self._max_mhz: list[float] = []
        self._listed = False
        self._idle_reads = 0

    def read(self) -> tuple[float, float] | None:
        """``(mean current MHz, mean maximum MHz)`` over the CPUs with cpufreq, or None."""
        if not self._listed or (not self._fds and self._idle_reads >= RELIST_READS):
            self._list()
        if not self._fds:
            self._idle_reads += 1
            return None
        cur: list[float] = []
        top: list[float] = []
        for fd, mx in list(zip(self._fds, self._max_mhz, strict=True)):
            try:
                khz = float(os.pread(fd, 64, 0))
            except (FileNotFoundError, ProcessLookupError, ValueError):
                self._drop(fd)
                continue
            cur.append(khz / 1000.0)
            top.append(mx)
        if not cur:
            return None
        return sum(cur) / len(cur), sum(top) / len(top)

    def _list(self) -> None:
        self.close()
        self._listed, self._idle_reads = True, 0
        try:
            names = sorted(n for n in os.listdir(self._root) if _CPU.fullmatch(n))
        except OSError:
            return
        for name in names:
            freq = self._root / name / "cpufreq"
            try:
                mx = _khz(freq / "cpuinfo_max_freq") or _khz(freq / "scaling_max_freq")
                if not mx:
                    continue
                fd = os.open(freq / "scaling_cur_freq", os.O_RDONLY)
            except (OSError, ValueError):
                continue
            self._fds.append(fd)
            self._max_mhz.append(mx / 1000.0)

    def _drop(self, fd: int) -> None:
        i = self._fds.index(fd)
        del self._fds[i], self._max_mhz[i]
        os.close(fd)

    def close(self) -> None:
        """Close the descriptors held (a later read lists the CPUs again)."""
        fds, self._fds, self._max_mhz = self._fds, [], []
        self._listed = False
        for fd in fds:
            os.close(fd)


def _khz(path: Path) -> float | None:
    try:
        return float(path.read_text().strip())
    except FileNotFoundError:
        return None

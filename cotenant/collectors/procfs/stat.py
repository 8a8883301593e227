"""Reading ``/proc/<pid>/stat`` and naming a process: the procfs collector's parsing.

:func:`parse_stat` (and its bytes twin on the poll's hot path) splits a ``stat`` line after the
last ``)`` of ``comm`` (which may hold spaces and parentheses); :func:`program_name` names an
interpreter by its script or module.
"""

from __future__ import annotations

import os
import resource

INTERPRETERS = frozenset(("node", "java", "ruby", "perl", "php", "bash", "sh", "dotnet"))
NAME_MAX = 80


def read_small(path: str) -> bytes:
    """A small procfs file in one read (os calls: pathlib costs more than the read itself)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def parse_stat_bytes(raw: bytes) -> tuple[bytes, int, int, int]:
    """:func:`parse_stat` of the undecoded line (``comm`` as bytes), and the parent pid
    (field 4): the poll's hot path. Splits only up to starttime (field 22) of the 52 fields."""
    open_, close = raw.find(b"("), raw.rfind(b")")
    if open_ < 0 or close < open_:
        raise ValueError("no (comm) in stat")
    rest = raw[close + 2 :].split(None, 20)
    return raw[open_ + 1 : close], int(rest[11]) + int(rest[12]), int(rest[19]), int(rest[1])


def fd_budget() -> int:
    """How many ``stat`` descriptors a collector may hold: a quarter of the soft
    ``RLIMIT_NOFILE`` (the receivers' sockets and DuckDB need the rest)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 20 if soft == resource.RLIM_INFINITY else max(0, soft // 4)


def parse_stat(text: str) -> tuple[str, int, int]:
    """``(comm, utime + stime, starttime)`` from the text of ``/proc/<pid>/stat`` (times in
    clock ticks). ``comm`` may hold spaces and parentheses, so fields are counted after its
    last ``)``. Raises ValueError on a malformed line."""
    open_, close = text.find("("), text.rfind(")")
    if open_ < 0 or close < open_:
        raise ValueError("no (comm) in stat")
    rest = text[close + 2 :].split()
    # rest[0] is field 3 (state): utime, stime and starttime are fields 14, 15 and 22
    return text[open_ + 1 : close], int(rest[11]) + int(rest[12]), int(rest[19])


def program_name(comm: str, cmdline: bytes) -> str:
    """A readable name: ``comm``, or for an interpreter its script or ``-m`` module too."""
    if not (comm.startswith("python") or comm in INTERPRETERS):
        return comm[:NAME_MAX]
    args = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a][1:]
    for i, a in enumerate(args):
        if a == "-m" and i + 1 < len(args):
            return f"{comm} {args[i + 1]}"[:NAME_MAX]
        if a == "-c":
            return f"{comm} -c"
        if not a.startswith("-"):
            return f"{comm} {os.path.basename(a)}"[:NAME_MAX]
    return comm[:NAME_MAX]

"""The series every cotenant process exposes about itself on ``/metrics``.

* ``cotenant_build_info{version, python, role}`` 1: which release runs, on which Python, as
  ``serve`` or ``agent`` (join it to any other series by ``instance`` to see what a node runs);
* ``process_*``: prometheus_client's process collector (CPU seconds, resident and virtual
  memory, open and maximum file descriptors, start time), read from ``/proc/self``.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector


def cotenant_version() -> str:
    """The installed distribution's version; ``unknown`` when it is not installed (a source
    tree on ``PYTHONPATH``)."""
    try:
        return version("cotenant")
    except PackageNotFoundError:
        return "unknown"


def register_process_series(registry: CollectorRegistry, role: str) -> None:
    """Add ``cotenant_build_info`` and the ``process_*`` series to ``registry`` (once: a
    registry that has them already is left as it is)."""
    if any(m.name == "cotenant_build_info" for m in registry.collect()):
        return
    info = Gauge(
        "cotenant_build_info",
        "1, labelled with the version of cotenant, of Python and the role this process runs",
        ("version", "python", "role"),
        registry=registry,
    )
    info.labels(cotenant_version(), platform.python_version(), role).set(1)
    ProcessCollector(registry=registry)

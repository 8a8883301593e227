"""The root-cause vocabulary: every kind of cause a diagnosis can name, in one place.

A cause kind is a :class:`CauseKind` (a ``str`` enum, so a member equals its name as text and
serialises as it: ``CauseKind.THROTTLE == "throttle"``). The attribution's explainers
(:mod:`analysis.explainers`), the tabular mode, the actuation policy and the stores all use these
members; :data:`CAUSE_KINDS` is the tuple of their names, in the order the docs list them.

What each kind's culprit is (DESIGN.md, "Root-cause vocabulary"):

========== ======================================================================
kind       culprit
========== ======================================================================
cotenant   the co-located model or process whose GPU use rose
bandwidth  the model or process driving DRAM, PCIe or NVLink traffic (``resource``)
lock       the lock waited on (its holder in the evidence)
throttle   the GPU whose SM clock sat under its maximum
memory     the model whose GPU memory grew into a full GPU
cpu        the host process whose CPU use rose, or ``host`` (CPU frequency clamped)
load       the victim itself: its own arrivals or batches surged
mix        the victim itself: its requests got heavier (tokens, work units, inference time)
model_load the victim itself: loads on its replica, slower or more frequent than usual
unknown    none: the excess nothing above explains
========== ======================================================================
"""

from __future__ import annotations

from enum import StrEnum


class CauseKind(StrEnum):
    """One kind of root cause (see the module doc for each kind's culprit)."""

    COTENANT = "cotenant"
    BANDWIDTH = "bandwidth"
    LOCK = "lock"
    THROTTLE = "throttle"
    MEMORY = "memory"
    CPU = "cpu"
    LOAD = "load"
    MIX = "mix"
    MODEL_LOAD = "model_load"
    UNKNOWN = "unknown"

    @property
    def victim_is_culprit(self) -> bool:
        """The victim's own doing (its load, its heavier requests, its model loads)."""
        return self in (CauseKind.LOAD, CauseKind.MIX, CauseKind.MODEL_LOAD)


CAUSE_KINDS: tuple[str, ...] = tuple(k.value for k in CauseKind)
"""Every cause kind's name, ``unknown`` last."""


def cause_kind(name: str) -> CauseKind:
    """The member named ``name``. Raises ValueError naming the known kinds when there is none."""
    try:
        return CauseKind(name)
    except ValueError:
        raise ValueError(
            f"{name!r} is not a cause kind (known: {', '.join(CAUSE_KINDS)})"
        ) from None

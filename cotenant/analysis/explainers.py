"""Every explainer of the attribution, one per cause kind, in one table.

The order of :data:`EXPLAINERS` is the order in which claims of the same stage are served
(:mod:`analysis.apportion`): the victim's own heavier requests before anything else, the
GPU-side physics (shared among themselves), host CPU after them, model loads last. ``unknown``
has no explainer: it is what the claims leave.
"""

from __future__ import annotations

from collections.abc import Mapping

from cotenant.analysis.claims import Explainer
from cotenant.analysis.compute_causes import (
    BandwidthExplainer,
    CotenantExplainer,
    MemoryExplainer,
    ThrottleExplainer,
)
from cotenant.analysis.cpu_causes import CpuExplainer
from cotenant.analysis.load_causes import ModelLoadExplainer
from cotenant.analysis.lock_causes import LockExplainer
from cotenant.analysis.mix import MixExplainer
from cotenant.analysis.own_load import LoadExplainer
from cotenant.core.cause_kinds import CauseKind

EXPLAINERS: Mapping[CauseKind, Explainer] = {
    CauseKind.MIX: MixExplainer(),
    CauseKind.THROTTLE: ThrottleExplainer(),
    CauseKind.COTENANT: CotenantExplainer(),
    CauseKind.BANDWIDTH: BandwidthExplainer(),
    CauseKind.MEMORY: MemoryExplainer(),
    CauseKind.LOAD: LoadExplainer(),
    CauseKind.LOCK: LockExplainer(),
    CauseKind.CPU: CpuExplainer(),
    CauseKind.MODEL_LOAD: ModelLoadExplainer(),
}
"""Cause kind -> its explainer (stateless), in serving order."""

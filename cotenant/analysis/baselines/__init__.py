"""Reference root-cause rankers for the benchmark (NSigma, BARO) and the BOCPD change point
detector BARO uses; all follow :class:`analysis.baselines.base.Ranker`."""

from cotenant.analysis.baselines.baro import Baro
from cotenant.analysis.baselines.base import Ranker
from cotenant.analysis.baselines.bocpd import NormalGamma, anomaly_start, changepoint_probability
from cotenant.analysis.baselines.nsigma import NSigma
from cotenant.core.errors import UsageError

__all__ = [
    "Baro",
    "NSigma",
    "NormalGamma",
    "Ranker",
    "anomaly_start",
    "changepoint_probability",
    "make_ranker",
]


def make_ranker(name: str) -> Ranker:
    """The baseline called ``name`` (``nsigma`` or ``baro``) with its default settings; raises
    :class:`store.errors.UsageError` for any other name."""
    rankers: dict[str, type[Baro] | type[NSigma]] = {"baro": Baro, "nsigma": NSigma}
    if name not in rankers:
        raise UsageError(f"unknown baseline {name!r}: choose from {', '.join(sorted(rankers))}")
    return rankers[name]()

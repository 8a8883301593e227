"""The SLOs: p99 latency objectives per model and indicator, and the one definition of breach.

Built once from configuration (``[analysis] slo_ms``, ``slo_ttft_ms``, ``slo_tpot_ms`` and
``[rules] slo_default_ms``, by ``cotenant.app.config.slos_of``) or from a scenario, and handed to
every reader of SLOs: the live detector and on-demand diagnoses, the rendered alert rules,
the weekly report, the actuators' verification, the dashboard. So a model pages in Prometheus
exactly when its incident says ``breach``.

Units: milliseconds. An SLO <= 0 is "none". The default applies to models not named for that
indicator; a model named with a value <= 0 has no SLO whatever the default.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

E2E = "e2e"
TTFT = "ttft"
TPOT = "tpot"
INDICATORS: tuple[str, ...] = (E2E, TTFT, TPOT)
"""Latency indicators an SLO can be set on: end to end, time to first token, time per output
token (the last two for generative models)."""

BREACH = "breach"
"""Severity of a slowdown that crossed its SLO."""
DEGRADATION = "degradation"
"""Severity of a slowdown within its SLO (or of a model without one)."""
SEVERITIES = (BREACH, DEGRADATION)
BREACH_OP = ">"
"""The comparison of a p99 with its SLO that is a breach (strictly above), as PromQL writes it."""


def breach_sql(value: str, slo: str) -> str:
    """:func:`breach` as a SQL (or PromQL) condition on two expressions."""
    return f"({value} {BREACH_OP} {slo})"


def breach(p99_ms: np.ndarray | float, slo_ms: float | None) -> np.ndarray:
    """The one definition of breach, per value: a p99 (ms) strictly above the SLO; never for a
    model without one (``None`` or <= 0), never for a missing value (NaN). Shape of ``p99_ms``."""
    v = np.asarray(p99_ms, dtype=np.float64)
    if slo_ms is None or slo_ms <= 0:
        return np.zeros(v.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        return np.asarray(np.nan_to_num(v, nan=-np.inf) > slo_ms)


@dataclass(frozen=True)
class SloTable:
    """One indicator's SLOs (ms): ``explicit`` model -> SLO, else ``default`` (0: none)."""

    explicit: Mapping[str, float] = field(default_factory=dict)
    default: float = 0.0

    def of(self, model: str) -> float | None:
        """``model``'s SLO in ms, or None when it has none."""
        v = self.explicit.get(model, self.default)
        return float(v) if v > 0 else None

    def groups(self) -> list[tuple[float, list[str]]]:
        """The models named explicitly, grouped by SLO value (> 0), ascending."""
        out: dict[float, list[str]] = {}
        for m, v in sorted(self.explicit.items()):
            if v > 0:
                out.setdefault(float(v), []).append(m)
        return sorted(out.items())


class SloLookup(Mapping[str, float]):
    """One indicator's SLOs as a read-only ``model -> ms`` mapping that knows the default:
    ``model in lookup`` and ``lookup[model]`` answer for every model with an SLO, named or by
    the default; iteration lists the named models with one (models that only the default
    covers cannot be listed). What code written against a ``model -> SLO`` dict takes."""

    def __init__(self, table: SloTable) -> None:
        self._t = table

    def __getitem__(self, model: str) -> float:
        v = self._t.of(model)
        if v is None:
            raise KeyError(model)
        return v

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self._t.of(model) is not None

    def __iter__(self) -> Iterator[str]:
        return iter([m for m, v in self._t.explicit.items() if v > 0])

    def __len__(self) -> int:
        return sum(1 for v in self._t.explicit.values() if v > 0)


@dataclass(frozen=True)
class Slos:
    """Every indicator's :class:`SloTable`. Missing indicators have no SLO."""

    tables: Mapping[str, SloTable] = field(default_factory=dict)

    @classmethod
    def of_maps(
        cls,
        e2e: Mapping[str, float] | None = None,
        *,
        ttft: Mapping[str, float] | None = None,
        tpot: Mapping[str, float] | None = None,
        default_ms: float = 0.0,
    ) -> Slos:
        """From per-indicator ``model -> ms`` maps; ``default_ms``: the end-to-end SLO of every
        model not in ``e2e`` (TTFT and TPOT have no default)."""
        return cls(
            {
                E2E: SloTable(dict(e2e or {}), float(default_ms)),
                TTFT: SloTable(dict(ttft or {})),
                TPOT: SloTable(dict(tpot or {})),
            }
        )

    def table(self, indicator: str = E2E) -> SloTable:
        """The SLOs of ``indicator`` (an empty table for an indicator without any)."""
        if indicator not in INDICATORS:
            raise ValueError(f"unknown indicator {indicator!r} (one of {', '.join(INDICATORS)})")
        return self.tables.get(indicator, SloTable())

    def of(self, model: str, indicator: str = E2E) -> float | None:
        """``model``'s SLO on ``indicator`` in ms, or None."""
        return self.table(indicator).of(model)

    def breached(self, model: str, p99_ms: float, indicator: str = E2E) -> bool:
        """The one definition of breach: a p99 strictly above the model's SLO on that
        indicator (never, for a model without one)."""
        return bool(breach(p99_ms, self.of(model, indicator)))

    def explicit(self, indicator: str = E2E) -> dict[str, float]:
        """The models named for ``indicator`` -> ms (what ``[analysis] slo_ms`` lists)."""
        return dict(self.table(indicator).explicit)

    @property
    def default_ms(self) -> float:
        """The end-to-end SLO of models not named (0: none)."""
        return self.table(E2E).default

    def lookup(self, indicator: str = E2E) -> SloLookup:
        """``indicator``'s SLOs as a ``model -> ms`` mapping with the default applied."""
        return SloLookup(self.table(indicator))

    def token_slos(self, model: str) -> dict[str, float | None]:
        """``{"ttft": ms | None, "tpot": ms | None}`` of ``model``."""
        return {TTFT: self.of(model, TTFT), TPOT: self.of(model, TPOT)}

    def models(self) -> set[str]:
        """Every model named for any indicator."""
        return {m for t in self.tables.values() for m in t.explicit}

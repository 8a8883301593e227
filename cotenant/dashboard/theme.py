"""Colours and chart styling shared by every page, so a model keeps its colour everywhere."""

from __future__ import annotations

from collections.abc import Iterable

MODEL_PALETTE: tuple[str, ...] = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#393b79",
)
PROCESS_COLOUR = "#7f7f7f"
"""Non-model GPU processes (training jobs, ETL, …) are grey, each a different dash/opacity."""

PHASE_COLOURS: dict[str, str] = {
    "queue_ms": "#9ecae1",
    "lock_wait_ms": "#d62728",
    "preprocess_ms": "#fdae6b",
    "h2d_ms": "#bcbddc",
    "compute_ms": "#3182bd",
    "d2h_ms": "#756bb1",
    "postprocess_ms": "#fd8d3c",
    "other_ms": "#bdbdbd",
}
SLO_COLOUR = "#d62728"
SPIKE_FILL = "rgba(214, 39, 40, 0.12)"
STATE_COLOURS: dict[str, str] = {
    "proposed": "#ff7f0e",
    "approved": "#17becf",
    "applied": "#1f77b4",
    "verified": "#2ca02c",
    "rolled_back": "#9467bd",
    "failed": "#d62728",
    "expired": "#7f7f7f",
}


class Colours:
    """Model -> colour, fixed for the life of the app: models are numbered in the order of
    their sorted names the first time they are seen, so adding a model never recolours the
    others."""

    def __init__(self) -> None:
        self._assigned: dict[str, str] = {}

    def learn(self, models: Iterable[str]) -> None:
        for m in sorted(set(models)):
            if m not in self._assigned:
                self._assigned[m] = MODEL_PALETTE[len(self._assigned) % len(MODEL_PALETTE)]

    def models(self) -> set[str]:
        return set(self._assigned)

    def __call__(self, name: str | None, *, model: bool = True) -> str:
        if name is None or not model:
            return PROCESS_COLOUR
        if name not in self._assigned:
            self.learn([name])
        return self._assigned[name]

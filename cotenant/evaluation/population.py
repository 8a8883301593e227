"""Generated scenario populations: a *development* one to tune on, a *test* one to report on.

A population is an endless, deterministic sequence of scenarios drawn from the distributions
of :class:`Distributions` (stated once, here, and in docs/accuracy.md): scenario ``i`` of
population ``P`` is drawn from a random stream seeded by :func:`scenario_seed` ``(P, i)``, and
its simulator seed is that same number. The populations' seed ranges are disjoint, so a
development scenario never shares a seed with a test one, whatever the counts:

==========  =================  ============================
population  faulted scenarios  fault-free controls
==========  =================  ============================
``dev``     1,000,000 + i      3,000,000 + i
``test``    2,000,000 + i      4,000,000 + i
==========  =================  ============================

**Rule**: thresholds and rules are tuned on ``dev`` only. ``test`` is run to report; nobody
looks at an individual test scenario to change the detector (its aggregate figures are what
docs/accuracy.md shows).

A drawn scenario is built as the document a scenario YAML file holds and validated by the
loader's own parser (:func:`simulator.scenario_load.parse_scenario`), so it is exactly as valid
as a file; :func:`scenario_yaml` writes it out. Drawing is in two steps:
:func:`draw_spec` (pure arithmetic on the seed: the document without SLOs and what was drawn,
for cheap checks of the distributions) and :func:`materialise`, which runs a short fault-free
pilot of the scenario to set each model's SLO as a multiple of its own pilot p99 (an
operator's way of setting one). :func:`draw_scenario` does both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import yaml

from cotenant.core.errors import UsageError
from cotenant.evaluation.distributions import DEFAULT, Distributions
from cotenant.evaluation.population_faults import draw_faults
from cotenant.evaluation.population_models import draw_node
from cotenant.simulator.engine import Simulation
from cotenant.simulator.scenario import Scenario
from cotenant.simulator.scenario_load import TRACES_DIR, parse_scenario

Population = Literal["dev", "test"]
POPULATIONS: tuple[Population, ...] = ("dev", "test")
MAX_INDEX = 1_000_000
"""Scenarios per population and kind; the seed ranges below are this wide."""
_SEED_BASE: dict[tuple[str, str], int] = {
    ("dev", "faulted"): 1_000_000,
    ("test", "faulted"): 2_000_000,
    ("dev", "control"): 3_000_000,
    ("test", "control"): 4_000_000,
}
Kind = Literal["faulted", "control"]


def scenario_seed(population: str, index: int, kind: Kind = "faulted") -> int:
    """The seed of scenario ``index`` of ``population`` (disjoint ranges per population and
    kind, module doc). Raises UsageError for an unknown population or an index out of range."""
    if population not in POPULATIONS:
        raise UsageError(f"unknown population {population!r}: choose from {', '.join(POPULATIONS)}")
    if not 0 <= index < MAX_INDEX:
        raise UsageError(f"scenario index {index}: must be in 0..{MAX_INDEX - 1}")
    return _SEED_BASE[(population, kind)] + index


@dataclass(frozen=True)
class ScenarioSpec:
    """A drawn scenario before its pilot: the YAML document (no SLOs yet), each model's SLO
    class and multiplier, and what was drawn (``drawn``: per model its mean rate, arrival kind
    and whether it is an LLM; per fault its kind, size and duration)."""

    population: str
    index: int
    kind: Kind
    doc: dict[str, Any]
    slo: dict[str, tuple[str, float]]  # model -> (tight | loose | absent, x pilot p99)
    drawn: dict[str, Any]

    @property
    def seed(self) -> int:
        return int(self.doc["seed"])

    @property
    def name(self) -> str:
        return str(self.doc["name"])


def draw_spec(
    population: str, index: int, kind: Kind = "faulted", dist: Distributions = DEFAULT
) -> ScenarioSpec:
    """Scenario ``index`` of ``population`` before its pilot (no simulation: cheap)."""
    seed = scenario_seed(population, index, kind)
    rng = np.random.default_rng(seed)
    node = draw_node(rng, dist)
    name = f"{population}-{index:04d}" if kind == "faulted" else f"{population}-control-{index:03d}"
    drawn: dict[str, Any] = {"faults": [], "adjusted": []}
    extra: dict[str, Any] = {}
    if kind == "faulted":
        faults = draw_faults(rng, dist, node)  # may adjust the node's models: build doc after
        extra = {**faults.doc_changes, "faults": faults.faults}
        duration_s = faults.duration_s
        drawn.update(faults=faults.drawn, adjusted=faults.adjusted)
    else:
        duration_s = float(round(rng.uniform(*dist.control_s)))
    doc: dict[str, Any] = {
        "version": 1,
        "name": name,
        "seed": seed,
        "duration_s": duration_s,
        **node.doc,
        **extra,
    }
    drawn["models"] = node.drawn
    classes = list(dist.slo_classes)
    probs = np.asarray([dist.slo_classes[c] for c in classes])
    slo: dict[str, tuple[str, float]] = {}
    for m in doc["models"]:
        c = str(rng.choice(classes, p=probs / probs.sum()))
        span = dist.tight_slo if c == "tight" else dist.loose_slo
        slo[m["name"]] = (c, float(rng.uniform(*span)) if c != "absent" else 0.0)
    return ScenarioSpec(population, index, kind, doc, slo, drawn)


def parse_spec(doc: dict[str, Any], source: str) -> Scenario:
    """A drawn document through the YAML loader's validation (relative trace files resolve
    against the bundled traces). Raises ScenarioError as a file would."""
    return parse_scenario(doc, TRACES_DIR, source=source)


def pilot_p99(s: Scenario, pilot_s: float) -> dict[str, float]:
    """Each model's p99 latency (ms) over the first ``pilot_s`` seconds of ``s`` without its
    faults: the same arrivals as the run itself up to the first fault."""
    sim = Simulation(replace(s, faults=()))
    sim.run_until(min(pilot_s, s.duration_s))
    cols = sim.take_requests()
    models = np.asarray(cols["model"], dtype=object)
    lat = np.asarray(cols["latency_ms"], dtype=np.float64)
    return {m: float(np.percentile(lat[models == m], 99)) for m in set(models.tolist())}


def materialise(spec: ScenarioSpec, dist: Distributions = DEFAULT) -> Scenario:
    """The scenario of ``spec`` with its SLOs set from a fault-free pilot: tight or loose SLO
    = the multiplier x the model's p99 over the first ``dist.pilot_s`` seconds (a model that
    served nothing in the pilot gets none). Validated by the loader."""
    source = f"<{spec.name}>"
    bare = parse_spec(spec.doc, source)
    p99 = pilot_p99(bare, dist.pilot_s)
    doc = dict(spec.doc)
    models = []
    for m in spec.doc["models"]:
        cls, mult = spec.slo[m["name"]]
        got = p99.get(m["name"])
        m = dict(m)
        if cls != "absent" and got is not None and got > 0:
            m["slo_p99_ms"] = round(mult * got, 3)
        models.append(m)
    doc["models"] = models
    return parse_spec(doc, source)


def draw_scenario(
    population: str, index: int, kind: Kind = "faulted", dist: Distributions = DEFAULT
) -> Scenario:
    """Scenario ``index`` of ``population``: drawn, piloted, validated."""
    return materialise(draw_spec(population, index, kind, dist), dist)


def scenario_yaml(s: Scenario, spec: ScenarioSpec) -> str:
    """``spec``'s document with the SLOs of its materialised scenario ``s``, as YAML that
    :func:`simulator.scenario_load.load_scenario` reads back to ``s`` (trace files are named
    relative to the bundled traces)."""
    slo = {m.name: m.slo_p99_ms for m in s.models}
    doc = dict(spec.doc)
    doc["models"] = [
        {**m, **({"slo_p99_ms": slo[m["name"]]} if slo[m["name"]] else {})}
        for m in spec.doc["models"]
    ]
    head = (
        f"# Drawn from the {spec.population} population, {spec.kind} scenario {spec.index} "
        f"(cotenant.evaluation.population); SLOs from a {DEFAULT.pilot_s:g} s pilot.\n"
    )
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)


def population_indices(count: int, start: int = 0) -> list[int]:
    """Indices ``start .. start + count - 1``, checked against the seed range."""
    if count < 0 or start < 0 or start + count > MAX_INDEX:
        raise UsageError(f"--count {count} from {start}: indices must stay in 0..{MAX_INDEX - 1}")
    return list(range(start, start + count))


def controls_for_hours(population: str, hours: float, dist: Distributions = DEFAULT) -> list[int]:
    """The first control indices of ``population`` whose durations add up to ``hours`` or
    more (none for 0)."""
    out: list[int] = []
    total = 0.0
    i = 0
    while total < hours * 3600 and i < MAX_INDEX:
        total += float(draw_spec(population, i, "control", dist).doc["duration_s"])
        out.append(i)
        i += 1
    return out

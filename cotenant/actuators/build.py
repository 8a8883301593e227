"""Builds the control loop from the ``[actuators]`` config (used by ``cotenant serve``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from cotenant.actuators.backend import Backend, Change
from cotenant.actuators.backends.factory import make_backend, read_secret
from cotenant.actuators.controller import ActionController, Notifier
from cotenant.actuators.policy import load_policy
from cotenant.actuators.proposals import IncidentSource
from cotenant.actuators.settings import ActuatorSettings
from cotenant.analysis.settings import AnalysisSettings
from cotenant.core.errors import BackendError
from cotenant.core.readers import MetricSource
from cotenant.core.slos import Slos
from cotenant.store.db import Store


class UnconfiguredBackend:
    """Stands in for a backend without a URL in ``dry-run`` mode, where nothing is applied:
    every call says what to configure."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _refuse(self) -> BackendError:
        return BackendError(
            f"{self.name} backend: no backend_url configured ([actuators] backend_url)"
        )

    def current(self, target: str) -> dict[str, Any]:
        raise self._refuse()

    def apply(self, change: Change) -> dict[str, Any]:
        raise self._refuse()

    def revert(self, target: str, before: dict[str, Any]) -> dict[str, Any]:
        raise self._refuse()


def build_controller(
    cfg: ActuatorSettings,
    *,
    store: Store,
    incidents: IncidentSource,
    source: MetricSource,
    registry: CollectorRegistry | None,
    clock_ns: Callable[[], int] = time.time_ns,
    slos: Slos | None = None,
    step_s: float = AnalysisSettings.step_s,
) -> ActionController | None:
    """The controller for the ``[actuators]`` keys ``cfg``, or None when the mode is
    ``off``. The policy, the token file and the backend are read and checked here, at start:
    a problem raises ConfigError naming the key or the policy file."""
    if cfg.mode == "off":
        return None
    policy = load_policy(cfg.policy or None)
    token = read_secret(cfg.token, cfg.token_file, "actuators.token_file")
    backend: Backend
    if cfg.backend_url or cfg.mode != "dry-run":
        backend = make_backend(cfg)
    else:
        backend = UnconfiguredBackend(cfg.backend)
    notifier: Notifier | None = backend if hasattr(backend, "notify") else None  # type: ignore[assignment]
    return ActionController(
        settings=cfg,
        policy=policy,
        incidents=incidents,
        source=source,
        backend=backend,
        store=store,
        token=token,
        registry=registry,
        clock_ns=clock_ns,
        slo_ms=(slos or Slos()).lookup(),
        step_s=step_s,
        notifier=notifier,
    )

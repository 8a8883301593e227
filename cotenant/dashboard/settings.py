"""The ``[dashboard]`` configuration keys."""

from __future__ import annotations

from dataclasses import dataclass

from cotenant.core.config_key import key


@dataclass(frozen=True)
class DashboardSettings:
    """``[dashboard]``: whether serve mounts the Dash app, and how its pages open and refresh
    (:func:`dashboard.app.create_app`)."""

    enabled: bool = key(True, "serve the Dash dashboard on the API port")
    refresh_s: float = key(5.0, "how often live pages refresh", min=0.5, max=3600.0)
    default_range: str = key("1h", "time range pages open with (e.g. 15m, 1h, 6h, 24h, 7d)")

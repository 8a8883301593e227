"""One module per page; each has ``layout(**url_query)`` and ``register(app, context)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dash


def register_page(
    module: str, *, path: str, name: str, order: int, layout: Callable[..., Any]
) -> None:
    """``dash.register_page`` with types (Dash's own is untyped)."""
    dash.register_page(module, path=path, name=name, order=order, layout=layout)  # type: ignore[no-untyped-call]

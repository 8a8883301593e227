"""A configuration key: one field of a package's settings dataclass, with its help and bounds.

Each package declares the ``cotenant.toml`` keys it reads as a frozen dataclass in its own
``settings`` module (``store/settings.py``, ``collectors/settings.py``, …); each field is made
by :func:`key`. ``cotenant/app/config.py`` composes those dataclasses into the configuration (one
TOML section each), reads the file and the ``COTENANT_…`` environment, and checks every value
against the metadata written here: ``help`` (one line, shown by ``cotenant config show``),
``min`` / ``max`` (inclusive bounds of a number), ``choices`` (the accepted strings) and
``secret`` (a token or key: ``cotenant config show`` prints it as ``"<hidden>"``).

The default given to :func:`key` is the key's only default: components that take the same
value as a keyword read it from the dataclass (``StoreSettings.memory_limit``) rather than
repeating it. It lives in ``store/`` because ``store`` is the package every other layer may
import (as :mod:`store.errors` does).
"""

from __future__ import annotations

from dataclasses import field
from typing import Any


def key(
    default: Any,
    help: str,
    *,
    min: float | None = None,
    max: float | None = None,
    choices: tuple[str, ...] | None = None,
    secret: bool = False,
) -> Any:
    """A dataclass field for a config key: its default, a one-line help and its bounds.

    The field's annotation must be one of ``bool``, ``int``, ``float``, ``str``,
    ``dict[str, str]`` or ``dict[str, float]``, written as a string (the settings modules use
    ``from __future__ import annotations``): the loader casts by that name. A ``dict`` default
    becomes a ``default_factory`` (a copy per instance), so no two configurations share one
    map."""
    meta = {"help": help, "min": min, "max": max, "choices": choices, "secret": secret}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)

"""argparse types for what users type on the command line."""

from __future__ import annotations

import argparse
import math

from store.errors import QueryError
from store.timespec import parse_duration_ns


def seconds(text: str) -> float:
    """A duration in seconds: plain seconds (``90``, ``0.5``) or with a unit (``90s``,
    ``4m``, ``1.5h``, ``250ms``); positive and finite, else argparse's error names it."""
    s = text.strip()
    try:
        value = float(s)
    except ValueError:
        try:
            value = parse_duration_ns(s) / 1e9
        except QueryError as exc:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a duration: use seconds (90) or a unit (90s, 4m, 1h)"
            ) from exc
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive duration")
    return value

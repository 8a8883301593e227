"""argparse types for what users type on the command line."""

from __future__ import annotations

import argparse
import math

from cotenant.core.errors import QueryError
from cotenant.core.timespec import parse_duration_ns


def _parse(text: str) -> float:
    s = text.strip()
    try:
        value = float(s)
    except ValueError:
        try:
            # parse_duration_ns reads "-15m" as 15 minutes ago; here it is a negative length
            value = parse_duration_ns(s) / 1e9 * (-1 if s.startswith("-") else 1)
        except QueryError as exc:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a duration: use seconds (90) or a unit (90s, 4m, 1h)"
            ) from exc
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite duration")
    return value


def duration(text: str) -> float:
    """A duration in seconds: plain seconds (``90``, ``0.5``) or with a unit (``90s``,
    ``4m``, ``1.5h``, ``250ms``); finite and not negative, else argparse's error names it."""
    value = _parse(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a duration of 0 or more")
    return value


def seconds(text: str) -> float:
    """A positive :func:`duration`."""
    value = _parse(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive duration")
    return value

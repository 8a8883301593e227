"""Durations on the command line take units, as --since does (issue 14)."""

from __future__ import annotations

import argparse

import pytest

from cotenant.cli.argtypes import duration, seconds


@pytest.mark.parametrize(
    ("text", "value"),
    [("90", 90.0), ("90s", 90.0), ("4m", 240.0), ("1.5h", 5400.0), ("250ms", 0.25)],
)
def test_durations_take_plain_seconds_or_a_unit(text: str, value: float) -> None:
    assert duration(text) == pytest.approx(value)
    assert seconds(text) == pytest.approx(value)


@pytest.mark.parametrize(
    ("fn", "text", "words"),
    [
        (duration, "5x", "not a duration"),
        (duration, "-3", "0 or more"),
        (duration, "nan", "finite"),
        (seconds, "0", "positive"),
        (seconds, "-1m", "positive"),
    ],
)
def test_bad_durations_are_refused_by_name(fn, text: str, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(argparse.ArgumentTypeError, match=words):
        fn(text)
    assert duration("0") == 0.0

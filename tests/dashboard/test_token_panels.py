"""The incident page's TTFT / TPOT panel exists only for models that have token timings."""

from __future__ import annotations

from cotenant.dashboard import figures
from cotenant.dashboard.data import Cols


def _windows(model: str, ttft: list[float | None], tpot: list[float | None]) -> Cols:
    n = len(ttft)
    return Cols(
        {
            "model": [model] * n,
            "ts_ns": [i * 1_000_000_000 for i in range(n)],
            "ttft_p99_ms": ttft,
            "tpot_p99_ms": tpot,
        }
    )


def _panels(t: Cols) -> figures.Fig | None:
    return figures.token_panels(t, lambda _: "#333333", {}, to_time=lambda ns: [str(v) for v in ns])


def test_a_model_without_token_timings_gets_no_empty_panel() -> None:
    # seen on the incident page of an embedding model: an empty "time to first token" chart
    assert _panels(_windows("embed", [None, None, None], [None, None, None])) is None
    assert _panels(_windows("embed", [float("nan")] * 2, [float("nan")] * 2)) is None


def test_a_generative_model_gets_its_ttft_and_tpot() -> None:
    both = Cols(
        {
            k: _windows("chat", [40.0, 42.0], [9.0, 9.5])[k]
            + _windows("embed", [None, None], [None, None])[k]
            for k in ("model", "ts_ns", "ttft_p99_ms", "tpot_p99_ms")
        }
    )
    fig = _panels(both)
    assert fig is not None
    names = [tr["name"] for tr in fig["data"]]
    assert names == ["chat TTFT p99", "chat TPOT p99"]

"""Connection caps: counting by peer, refusing at each cap, the open-file limit."""

from __future__ import annotations

import logging
import resource
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge

from cotenant.gateway.conn_caps import ConnectionCaps, ensure_file_limit


def test_caps_count_per_peer_and_in_all_and_free_places_on_release() -> None:
    gauge = Gauge("g", "open", registry=CollectorRegistry())
    caps = ConnectionCaps(max_total=3, max_per_client=2, gauge=gauge)
    assert [caps.admit("a"), caps.admit("a"), caps.admit("a")] == [None, None, "per_client"]
    assert caps.admit("b") is None
    assert caps.admit("c") == "total"  # refused ones count nothing
    assert caps.total == 3 and caps.per_client == {"a": 2, "b": 1} and gauge._value.get() == 3
    caps.release("a")
    assert caps.admit("c") is None
    for peer in ("a", "b", "c"):
        caps.release(peer)
    assert caps.total == 0 and caps.per_client == {} and gauge._value.get() == 0


def test_zero_turns_a_cap_off() -> None:
    caps = ConnectionCaps(0, 0, Gauge("g", "open", registry=CollectorRegistry()))
    assert all(caps.admit("a") is None for _ in range(1000))


@pytest.fixture
def nofile() -> Iterator[tuple[int, int]]:
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield limits
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def test_the_file_limit_is_raised_towards_the_cap(
    nofile: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    _, hard = nofile
    if hard == resource.RLIM_INFINITY or hard < 512:
        pytest.skip("needs a finite hard limit of at least 512 open files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    assert ensure_file_limit(300) == 300
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 300
    assert ensure_file_limit(200) == 300  # never lowered
    with caplog.at_level(logging.WARNING):
        assert ensure_file_limit(hard + 1) == hard
    assert "open-file limit" in caplog.text and "--max-connections" in caplog.text

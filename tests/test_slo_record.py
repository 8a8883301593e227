"""The SLOs a store was analysed with travel with the store (issue 14: the demo's report said
"no SLO" for tts although the demo ran it against a 100 ms SLO)."""

from __future__ import annotations

from pathlib import Path

from cotenant.app.config import Config
from cotenant.app.report_builder import report_builder
from cotenant.store.db import Store
from cotenant.store.slo_record import record_slos, recorded_slos


def test_recorded_slos_round_trip_and_replace(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    try:
        assert recorded_slos(store) == {}
        record_slos(store, {"tts": 100, "chat": 400.5})
        assert recorded_slos(store) == {"tts": 100.0, "chat": 400.5}
        record_slos(store, {"tts": 120})
        assert recorded_slos(store) == {"tts": 120.0}
    finally:
        store.close()


def test_an_unreadable_record_is_no_slo(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    try:
        with store.cursor() as cur:
            cur.execute("INSERT OR REPLACE INTO meta VALUES ('slo_ms', '{broken')")
        assert recorded_slos(store) == {}
    finally:
        store.close()


def test_a_report_over_the_store_uses_the_recorded_slos_under_its_own(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    store = Store(path)
    record_slos(store, {"tts": 100, "chat": 400})
    store.close()
    ro = Store(path, read_only=True)
    try:
        builder = report_builder(Config(), ro)
        assert builder.slos.explicit() == {"tts": 100.0, "chat": 400.0}
    finally:
        ro.close()

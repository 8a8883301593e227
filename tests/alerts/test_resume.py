"""Alerts a stopped service left pending are diagnosed by the next one."""

from __future__ import annotations

import json
import time
from pathlib import Path

from cotenant.alerts.payload import parse_payload
from cotenant.alerts.records import AlertBook
from cotenant.alerts.webhook import AlertReceiver
from cotenant.analysis.analyzer import Analyzer
from cotenant.analysis.incidents import IncidentBook
from cotenant.store.db import Store
from cotenant.store.source import StoreSource


def test_pending_alerts_are_diagnosed_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "store.duckdb"
    body = {
        "version": "4",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "ModelLatencySLOBreach", "model": "tts"},
                "startsAt": "2026-12-02T15:00:00Z",
                "fingerprint": "beef01",
            }
        ],
    }
    with Store(path) as store:  # the first run recorded the alert, then stopped
        assert AlertBook(store).claim(parse_payload(json.dumps(body).encode())[0], 1)
        assert (AlertBook(store).get("beef01") or {}).get("diagnosis_state") == "pending"
    with Store(path) as store:
        analyzer = Analyzer(StoreSource(store), IncidentBook(store))
        receiver = AlertReceiver(store, analyzer, clock_ns=time.time_ns)
        try:
            assert receiver.resumed == 1
            assert receiver.diagnoser.wait_idle(30)
            row = receiver.alert("beef01")
        finally:
            receiver.close()
    # the store holds no requests of tts: the diagnosis ran and says so
    assert row["diagnosis_state"] == "failed"
    assert "tts" in row["diagnosis"]["error"] and "no requests" in row["diagnosis"]["error"]

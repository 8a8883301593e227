"""``kill -9`` loses nothing acknowledged (issue 15, item 1): a real ``cotenant serve`` fed by
the real OTLP/HTTP exporter at a steady rate, killed with SIGKILL right after an
acknowledgement at several points of its life, restarted on the same store; every request
whose export got a 2xx must be in the store."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from conftest import start_serve

from .acked import stored_span_ids, stream_until_kill

KILL_AFTER_ACKS = (1, 7, 25)
"""Three kill points: right after the first acknowledged export of a fresh server, early in
the stream, and once the writer has committed many groups (``bench/kill9.py`` runs more)."""

ENV = {
    "COTENANT_NVML_ENABLED": "false",
    "COTENANT_DASHBOARD_ENABLED": "false",
    "COTENANT_ANALYSIS_ENABLED": "false",
    "COTENANT_OTLP_GRPC_ENABLED": "false",
}


ROUNDS = int(os.environ.get("COTENANT_KILL9_ROUNDS", "1"))
"""Rounds of the whole sequence, each on a fresh store (``make reliability`` runs 10)."""


SPOOLED = {
    **ENV,
    "COTENANT_STORE_SPOOL": "true",
    # most kills land while acknowledged rows are only in the spool, not in DuckDB yet
    "COTENANT_STORE_FLUSH_INTERVAL_S": "5",
}
"""``store.spool`` on, as ``cotenant agent`` runs (acknowledged once in the fsync'd spool)."""


@pytest.mark.timeout(300 * ROUNDS)
@pytest.mark.parametrize("round_", range(ROUNDS))
@pytest.mark.parametrize("env", [ENV, SPOOLED], ids=["commit", "spool"])
def test_every_acknowledged_request_survives_kill_9(
    tmp_path: Path, round_: int, env: dict[str, str]
) -> None:
    store = tmp_path / "store.duckdb"
    acked: list[str] = []
    for life, kill_after in enumerate(KILL_AFTER_ACKS):
        served = start_serve(tmp_path, store, env)
        try:
            seed = round_ * 10 + life
            run = stream_until_kill(served.otlp_http, served.proc.pid, kill_after, seed=seed)
            assert run.killed, f"life {life}: the server was never killed"
            assert served.proc.wait(30) == -signal.SIGKILL
        finally:
            served.close()
        assert run.exports_acked >= kill_after
        acked += run.acked
    # a last life, stopped cleanly, proves the store still opens and takes data
    served = start_serve(tmp_path, store, env)
    run = stream_until_kill(served.otlp_http, served.proc.pid, None, max_s=1.0, seed=9)
    assert served.stop() == 0
    acked += run.acked
    stored = stored_span_ids(store)
    missing = set(acked) - stored
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged requests lost"
    assert len(acked) > 20 * sum(KILL_AFTER_ACKS)

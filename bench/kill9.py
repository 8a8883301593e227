"""Acknowledged requests lost to ``kill -9``, under each ``store.ack`` mode.

Run ``.venv/bin/python bench/kill9.py`` (``--runs 10`` by default). Each run: a fresh store;
a real ``cotenant serve`` fed by the real OTLP/HTTP exporter (batches of 20 requests at about
1,000 requests/s) is killed with SIGKILL right after its k-th acknowledged export, for each k
of ``--kill-after`` (three kill points), restarted on the same store each time, and finally
stopped cleanly; then every request whose export got a 2xx is looked up in the store file.
Prints, per mode, requests acknowledged and lost over all runs (the goal: 0 lost under the
default ``durable``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import start_serve  # noqa: E402
from reliability.acked import stored_span_ids, stream_until_kill  # noqa: E402

ENV = {
    "COTENANT_NVML_ENABLED": "false",
    "COTENANT_DASHBOARD_ENABLED": "false",
    "COTENANT_ANALYSIS_ENABLED": "false",
    "COTENANT_OTLP_GRPC_ENABLED": "false",
}


def one_run(tmp: Path, mode: str, kill_after: list[int], seed: int) -> dict[str, Any]:
    store = tmp / f"{mode}-{seed}.duckdb"
    env = {**ENV, "COTENANT_STORE_ACK": mode}
    acked: list[str] = []
    for life, k in enumerate(kill_after):
        served = start_serve(tmp, store, env)
        try:
            run = stream_until_kill(served.otlp_http, served.proc.pid, k, seed=seed * 10 + life)
            served.proc.wait(30)
        finally:
            served.close()
        acked += run.acked
    served = start_serve(tmp, store, env)  # a clean last life: the store still opens
    acked += stream_until_kill(served.otlp_http, served.proc.pid, None, max_s=0.5).acked
    served.stop()
    lost = set(acked) - stored_span_ids(store)
    return {"acked": len(acked), "lost": len(lost)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=10, help="runs per mode (default 10)")
    ap.add_argument("--modes", default="durable,queued", help="store.ack modes, comma-separated")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    rng = random.Random(15)
    res: dict[str, Any] = {"nproc": os.cpu_count(), "runs": args.runs, "modes": {}}
    with tempfile.TemporaryDirectory(prefix="cotenant-kill9-") as tmp:
        for mode in args.modes.split(","):
            runs = []
            for r in range(args.runs):
                # three kill points per run: soon after start, early, and later in the stream
                points = [rng.randint(1, 3), rng.randint(4, 12), rng.randint(13, 40)]
                t0 = time.monotonic()
                out = one_run(Path(tmp), mode, points, r)
                out["kill_after_acks"] = points
                runs.append(out)
                print(
                    f"[kill9] {mode} run {r + 1}/{args.runs}: kills after acks {points}: "
                    f"{out['acked']} acked, {out['lost']} lost ({time.monotonic() - t0:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
            res["modes"][mode] = {
                "acked": sum(x["acked"] for x in runs),
                "lost": sum(x["lost"] for x in runs),
                "runs_with_loss": sum(1 for x in runs if x["lost"]),
                "runs": runs,
            }
    for mode, m in res["modes"].items():
        print(
            f"store.ack = {mode}: {args.runs} runs x 3 kill -9: {m['acked']} requests "
            f"acknowledged, {m['lost']} lost ({m['runs_with_loss']} runs with a loss)"
        )
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

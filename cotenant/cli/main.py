"""``cotenant`` command line: serve, config show, nvml."""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from cotenant.app.config import Config, load_config
from cotenant.core.errors import CotenantError

EXIT_USAGE = 2


def _configure_logging(cfg: Config) -> None:
    from cotenant.app.log_format import configure_logging

    configure_logging(cfg.log.level, cfg.log.format)


def _load(args: argparse.Namespace) -> Config:
    path = args.config or os.environ.get("COTENANT_CONFIG")
    cfg = load_config(path)
    if getattr(args, "store", None):
        cfg = dataclasses.replace(cfg, store=dataclasses.replace(cfg.store, path=args.store))
    return cfg


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _configure_logging(cfg)
    from cotenant.app.service import Service  # heavy imports only for serve

    service = Service(cfg)
    service.run()
    return 0


def cmd_agent(args: argparse.Namespace) -> int:
    """``cotenant agent``: [agent] store and retention replace [store]'s (``--store`` wins)."""
    cfg = _load(args)
    ag = cfg.agent
    store = dataclasses.replace(
        cfg.store,
        path=args.store or ag.store,
        raw_retention_h=ag.raw_retention_h,
        rollup_interval_s=cfg.store.rollup_interval_s if ag.rollups else 3600.0,
        flush_interval_s=ag.flush_interval_s,
        spool=ag.spool,
    )
    cfg = dataclasses.replace(cfg, store=store)
    tail = None
    if args.fake_nvml is not None:  # checked before anything starts
        from cotenant.simulator.nvml_feed_tail import FeedTail

        tail = FeedTail(Path(args.fake_nvml))
    _configure_logging(cfg)
    import prometheus_client

    from cotenant.app.service import Service

    # no `_created` twin of every counter: it doubles the series a node sends to Prometheus
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    if tail is None:
        Service(cfg, role="agent").run()
        return 0
    # a simulated GPU instead of the driver: NVML on, samples named after the agent's node
    nvml = dataclasses.replace(cfg.nvml, enabled=True, host=cfg.nvml.host or ag.node)
    service = Service(
        dataclasses.replace(cfg, nvml=nvml), role="agent", nvml=tail.fake, clock_ns=tail.clock
    )
    if service.nvml is not None:
        tail.on_gpus = service.nvml.rediscover_soon
    tail.start()
    try:
        service.run()
    finally:
        tail.stop()
    return 0


def cmd_nvml(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _configure_logging(cfg)
    from cotenant.collectors.nvml.api import load_pynvml
    from cotenant.core.errors import NvmlUnavailable

    try:
        api = load_pynvml()
    except NvmlUnavailable as exc:
        print(f"cotenant nvml: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return nvml_report(api, cfg, sys.stdout)


def nvml_report(
    nvml: Any,
    cfg: Config,
    out: TextIO,
    *,
    clock: Callable[[], int] = time.time_ns,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """``cotenant nvml``: one line per GPU and MIG instance, then the counters of two polls
    ``min(nvml.poll_interval_s, 1)`` apart (byte rates need two reads). Exit 2, with what
    to do on stderr, where NVML is unavailable."""
    import pyarrow as pa

    from cotenant.collectors.gpu_resolve import GpuResolver
    from cotenant.collectors.nvml.collector import NvmlCollector
    from cotenant.core.errors import NvmlUnavailable

    tables: dict[str, pa.Table] = {}
    collector = NvmlCollector(
        nvml,
        sink=tables.__setitem__,
        resolver=GpuResolver(),
        host=cfg.nvml.host or socket.gethostname(),
        clock=clock,
        batch_interval_s=0.0,
    )
    try:
        collector.open()
    except NvmlUnavailable as exc:
        print(f"cotenant nvml: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        devices = collector.devices()
        driver = _try(nvml.nvmlSystemGetDriverVersion) or "unknown"
        gpus = sum(d.parent is None for d in devices)
        out.write(f"NVML: {gpus} GPUs on host {collector.host} (driver {driver})\n")
        for d in devices:
            kind = f"GPU {d.index}" if d.parent is None else "  MIG"
            mig = ("MIG on" if d.mig_enabled else "MIG off") if d.parent is None else ""
            state = "" if d.up else "  DOWN"
            out.write(
                f"{kind}  {d.uuid}  {d.name}  memory {_gib(d.memory_total_bytes)}  {mig}{state}\n"
            )
        interval = min(cfg.nvml.poll_interval_s, 1.0)
        collector.poll_once()
        tables.clear()
        sleep(interval)
        collector.poll_once()
        out.write(f"counters (rates over {interval:g} s):\n")
        procs = tables["process_samples"].to_pylist() if "process_samples" in tables else []
        for g in tables["gpu_samples"].to_pylist() if "gpu_samples" in tables else []:
            out.write(_gpu_line(g) + "\n")
            for p in procs:
                if p["gpu"] == g["gpu"]:
                    out.write(_process_line(p) + "\n")
    finally:
        collector.stop()
    return 0


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # only decoration for the report; NVML errors vary by driver
        return None


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.1f} GiB"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


def _bps(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e9:.2f} GB/s"


def _num(v: float | None, unit: str) -> str:
    return "-" if v is None else f"{v:.0f} {unit}"


def _gpu_line(g: dict[str, Any]) -> str:
    from cotenant.collectors.nvml.metrics import CLOCK_EVENT_REASONS

    r = g["clock_event_reasons"]
    reasons = "-" if r is None else f"{r:#x}"
    if r:
        reasons += " " + ",".join(name for name, bit in CLOCK_EVENT_REASONS if r & bit)
    return (
        f"{g['gpu']}  sm {_pct(g['sm_util'])}  mem {_pct(g['mem_util'])}  "
        f"used {_gib(g['mem_used_bytes'])} of {_gib(g['mem_total_bytes'])}  "
        f"pcie tx {_bps(g['pcie_tx_bps'])} rx {_bps(g['pcie_rx_bps'])}  "
        f"nvlink tx {_bps(g['nvlink_tx_bps'])} rx {_bps(g['nvlink_rx_bps'])}  "
        f"power {_num(g['power_w'], 'W')}  temp {_num(g['temp_c'], 'C')}  "
        f"sm clock {_num(g['sm_clock_mhz'], 'MHz')} of {_num(g['max_sm_clock_mhz'], 'MHz')}  "
        f"clock events {reasons}"
    )


def _process_line(p: dict[str, Any]) -> str:
    return (
        f"  pid {p['pid']}  {p['process_name'] or '?'}  model {p['model'] or '-'}  "
        f"sm {_pct(p['sm_util'])}  mem {_pct(p['mem_util'])}  used {_gib(p['mem_used_bytes'])}"
    )


def cmd_config_show(args: argparse.Namespace) -> int:
    cfg = _load(args)
    sys.stdout.write(cfg.to_toml())
    return 0


def cmd_config_keys(args: argparse.Namespace) -> int:
    from cotenant.app.config import keys_markdown

    sys.stdout.write(keys_markdown())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cotenant",
        description="Find which co-tenant made a model slow on a shared GPU, and fix it.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def common(sp: argparse.ArgumentParser, store: bool = True) -> None:
        sp.add_argument(
            "--config",
            metavar="FILE",
            help="TOML config file (default: $COTENANT_CONFIG, else built-in defaults)",
        )
        if store:
            sp.add_argument(
                "--store", metavar="PATH", help="DuckDB store file (overrides store.path)"
            )

    serve = sub.add_parser("serve", help="run collectors, store, analysis and the HTTP API")
    common(serve)
    serve.set_defaults(func=cmd_serve)

    agent = sub.add_parser(
        "agent",
        help="run on a GPU node: collectors, a short local store, /metrics for Prometheus and "
        "the drill-down API (docs/fleet-reference.md)",
    )
    common(agent)
    agent.add_argument(
        "--fake-nvml",
        metavar="PATH",
        help="for demos and tests: a simulated GPU instead of the driver, fed by "
        "`cotenant simulate --otlp URL --nvml-feed PATH` (the file may appear later)",
    )
    agent.set_defaults(func=cmd_agent)

    nvml = sub.add_parser(
        "nvml", help="list the GPUs NVML sees and print one poll of their counters"
    )
    common(nvml, store=False)
    nvml.set_defaults(func=cmd_nvml)

    config = sub.add_parser("config", help="configuration tools")
    csub = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    show = csub.add_parser("show", help="print the effective configuration as TOML")
    common(show)
    show.set_defaults(func=cmd_config_show)
    keys = csub.add_parser("keys", help="list every key as a Markdown table")
    keys.set_defaults(func=cmd_config_keys)

    from cotenant.cli.simulate import add_parser as add_simulate

    add_simulate(sub)

    from cotenant.cli.diagnose import add_parser as add_diagnose

    add_diagnose(sub)

    from cotenant.cli.demo import add_parser as add_demo

    add_demo(sub)

    from cotenant.cli.bench import add_parser as add_bench

    add_bench(sub)

    from cotenant.cli.import_gentd26 import add_parser as add_import

    add_import(sub)

    from cotenant.cli.rca_table import add_parser as add_rca_table

    add_rca_table(sub)

    from cotenant.cli.report import add_parser as add_report

    add_report(sub)

    from cotenant.cli.gateway import add_parser as add_gateway

    add_gateway(sub)

    from cotenant.cli.rules import add_parser as add_rules

    add_rules(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except CotenantError as exc:
        print(f"cotenant: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"cotenant: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

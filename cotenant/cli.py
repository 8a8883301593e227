"""``cotenant`` command line: serve, config show."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence

from cotenant.config import Config, load_config
from store.errors import CotenantError

EXIT_USAGE = 2


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _load(args: argparse.Namespace) -> Config:
    path = args.config or os.environ.get("COTENANT_CONFIG")
    cfg = load_config(path)
    if getattr(args, "store", None):
        cfg = dataclasses.replace(cfg, store=dataclasses.replace(cfg.store, path=args.store))
    return cfg


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _configure_logging(cfg.log.level)
    from cotenant.service import Service  # heavy imports only for serve

    service = Service(cfg)
    service.run()
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    cfg = _load(args)
    sys.stdout.write(cfg.to_toml())
    return 0


def cmd_config_keys(args: argparse.Namespace) -> int:
    from cotenant.config import keys_markdown

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

    config = sub.add_parser("config", help="configuration tools")
    csub = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    show = csub.add_parser("show", help="print the effective configuration as TOML")
    common(show)
    show.set_defaults(func=cmd_config_show)
    keys = csub.add_parser("keys", help="list every key as a Markdown table")
    keys.set_defaults(func=cmd_config_keys)
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

"""``cotenant rules render``: write the Prometheus rule files for the configured SLOs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cotenant.alerts.rules.blocks import RuleSettings
from cotenant.alerts.rules.render import (
    check_labels,
    check_namespace,
    exporters_rule,
    prometheus_rule,
    write_rules,
)
from cotenant.app.config import Config, load_config
from cotenant.core.errors import ConfigError
from cotenant.core.slos import E2E, TPOT, TTFT


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "rules",
        help="Prometheus alerting and recording rules",
        description="Prometheus rules for cotenant's metrics (see docs/alerting.md).",
    )
    rsub = p.add_subparsers(dest="rules_command", metavar="SUBCOMMAND", required=True)
    render = rsub.add_parser(
        "render",
        help="write cotenant.rules.yml, exporters.rules.yml and fleet.rules.yml",
        description="Render the rule files from [analysis] slo_ms and [rules] (thresholds, "
        "for_s, runbook_base_url). With the default configuration this writes the files "
        "committed under rules/.",
    )
    render.add_argument(
        "--config",
        metavar="FILE",
        help="TOML config file (default: $COTENANT_CONFIG, else built-in defaults)",
    )
    render.add_argument(
        "--out", metavar="DIR", type=Path, default=Path("rules"), help="output folder (./rules)"
    )
    render.add_argument(
        "--prometheus-rule",
        metavar="FILE",
        type=Path,
        help="also write cotenant.rules.yml and fleet.rules.yml as one Prometheus Operator "
        "PrometheusRule manifest (deploy/k8s/prometheusrule.yaml is this with the defaults)",
    )
    render.add_argument(
        "--exporters-rule",
        metavar="FILE",
        type=Path,
        help="also write exporters.rules.yml as a PrometheusRule named cotenant-exporters "
        "(deploy/k8s/optional/prometheusrule-exporters.yaml is this with the defaults)",
    )
    render.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of the PrometheusRule manifests, beside [rules] labels; repeat it. Your "
        "Prometheus loads only the rules its ruleSelector matches: kube-prometheus-stack's "
        "selects release=<its Helm release> (kubectl get prometheus -A -o "
        "jsonpath='{..ruleSelector}')",
    )
    render.add_argument(
        "--namespace",
        metavar="NS",
        help="namespace of the PrometheusRule manifests (default [rules] namespace, cotenant); "
        "it must be one your Prometheus' ruleNamespaceSelector matches",
    )
    render.set_defaults(func=cmd_rules_render)


def manifest_labels(cfg: Config, given: list[str]) -> dict[str, str]:
    """[rules] labels, then each ``--label KEY=VALUE`` (checked; ConfigError naming it)."""
    labels = check_labels(cfg.rules.labels, "config key rules.labels")
    for item in given:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ConfigError(f"--label {item!r}: expected KEY=VALUE")
        labels.update(check_labels({k: v}, f"--label {item!r}"))
    return labels


def settings_from(cfg: Config) -> RuleSettings:
    """The renderer's settings from a loaded configuration."""
    r = cfg.rules
    slos = cfg.slos()
    return RuleSettings(
        slo_ms=slos.explicit(E2E),
        slo_ttft_ms=slos.explicit(TTFT),
        slo_tpot_ms=slos.explicit(TPOT),
        slo_default_ms=slos.default_ms,
        dram_saturated=r.dram_saturated,
        pcie_saturated_bps=r.pcie_saturated_bps,
        lock_wait_share=r.lock_wait_share,
        memory_pressure=r.memory_pressure,
        for_s=r.for_s,
        runbook_base_url=r.runbook_base_url,
        scrape_interval_s=cfg.prometheus.scrape_interval_s,
    )


def cmd_rules_render(args: argparse.Namespace) -> int:
    cfg = load_config(args.config or os.environ.get("COTENANT_CONFIG"))
    settings = settings_from(cfg)
    labels = manifest_labels(cfg, args.label)
    if args.namespace is not None:
        namespace = check_namespace(args.namespace, "--namespace")
    else:
        namespace = check_namespace(cfg.rules.namespace, "config key rules.namespace")
    for p in write_rules(settings, args.out):
        print(f"wrote {p}")
    if args.prometheus_rule is not None:
        args.prometheus_rule.parent.mkdir(parents=True, exist_ok=True)
        text = prometheus_rule(settings, namespace=namespace, labels=labels)
        args.prometheus_rule.write_text(text, encoding="utf-8")
        print(f"wrote {args.prometheus_rule}")
    if args.exporters_rule is not None:
        args.exporters_rule.parent.mkdir(parents=True, exist_ok=True)
        text = exporters_rule(settings, namespace=namespace, labels=labels)
        args.exporters_rule.write_text(text, encoding="utf-8")
        print(f"wrote {args.exporters_rule}")
    return 0

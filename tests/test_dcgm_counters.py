"""deploy/dcgm-exporter/: a DCGM exporter counters file that collects every DCGM field the
fleet path reads, and the manifests (DaemonSet + ConfigMap) and Helm values that mount it where
the exporter's ``-f`` argument points. Kubernetes and CRD schemas: tests/test_manifest_schemas.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cotenant.collectors.prometheus import promql

ROOT = Path(__file__).resolve().parent.parent
DCGM = ROOT / "deploy" / "dcgm-exporter"
RULES = ROOT / "cotenant" / "rules"
TYPES = {"gauge", "counter", "label", "histogram"}
# dcgm-exporter's etc/default-counters.csv (4.5.3-4.8.2) leaves these out or commented: the
# fleet path cannot see throttling (reasons, max clock), SM active or NVLink traffic on a stock
# install (docs/fleet-install.md, "A DCGM exporter's counters")
NOT_IN_STOCK = {
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_MAX_SM_CLOCK",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
}
LEGACY = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"}  # DCGM < 3.3's name, read where it is exported


def _counters(text: str) -> dict[str, str]:
    """Field -> Prometheus type, for every line that is not a comment; raises on a bad line."""
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) != 3 or not re.fullmatch(r"DCGM_(FI|EXP)_\w+", parts[0]):
            raise ValueError(f"line {n}: not 'FIELD, type, help': {raw!r}")
        if parts[1] not in TYPES or not parts[2]:
            raise ValueError(f"line {n}: type {parts[1]!r} or help missing: {raw!r}")
        if parts[0] in out:
            raise ValueError(f"line {n}: {parts[0]} twice")
        out[parts[0]] = parts[1]
    return out


def _read_by_fleet_path() -> set[str]:
    """DCGM fields the PromQL source and the bundled exporter alert rules read."""
    exprs = [
        *promql.GPU_FIELDS.values(),
        promql.clock_reasons_query("1m"),
        promql.pod_gpus_query("1m"),
        (RULES / "exporters.rules.yml").read_text(),
    ]
    return {n for e in exprs for n in re.findall(r"\bDCGM_FI_\w+", e)}


def test_the_counters_file_collects_every_field_the_fleet_path_reads() -> None:
    counters = _counters((DCGM / "counters.csv").read_text())
    read = _read_by_fleet_path()
    assert read >= NOT_IN_STOCK  # what the file is for is still what the code reads
    assert read - LEGACY <= set(counters), sorted(read - LEGACY - set(counters))
    # gauges, as the exporter's own file types the rates; the bitmask is a value, not a count
    assert all(counters[n] == "gauge" for n in NOT_IN_STOCK)


@pytest.mark.parametrize(
    "bad,words",
    [
        ("DCGM_FI_DEV_SM_CLOCK gauge SM clock", "not 'FIELD, type, help'"),
        ("DCGM_FI_DEV_SM_CLOCK, gauges, SM clock", "type 'gauges'"),
        ("DCGM_FI_DEV_SM_CLOCK, gauge, a\nDCGM_FI_DEV_SM_CLOCK, gauge, b", "twice"),
    ],
)
def test_a_malformed_counters_line_is_refused(bad: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        _counters(bad)


def _docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DCGM / "dcgm-exporter.yaml").read_text()) if d]


def _file_arg(args: list[str]) -> str:
    i = args.index("-f")
    return args[i + 1]


def test_the_daemonset_runs_the_exporter_on_the_configmap_of_that_file() -> None:
    docs = {d["kind"]: d for d in _docs()}
    cm = docs["ConfigMap"]
    assert cm["data"]["counters.csv"] == (DCGM / "counters.csv").read_text(), (
        "copy deploy/dcgm-exporter/counters.csv into the ConfigMap of dcgm-exporter.yaml"
    )
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    path = _file_arg(c["args"])
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == path]
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    (item,) = [i for i in vol["configMap"]["items"] if i["path"] == mount["subPath"]]
    assert item["key"] in cm["data"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DCGM_EXPORTER_KUBERNETES"] == "true"  # the pod labels the fleet path joins
    sm = docs["ServiceMonitor"]["spec"]
    assert sm["selector"]["matchLabels"].items() <= pod_labels(docs).items()
    assert sm["endpoints"][0]["honorLabels"] is True


def pod_labels(docs: dict[str, dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = docs["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    return labels


def test_the_helm_values_mount_the_same_configmap_where_the_argument_points() -> None:
    values = yaml.safe_load((DCGM / "helm-values.yaml").read_text())
    cm = next(d for d in _docs() if d["kind"] == "ConfigMap")
    path = _file_arg(values["arguments"])
    (mount,) = [m for m in values["extraVolumeMounts"] if m["mountPath"] == path]
    (vol,) = [v for v in values["extraConfigMapVolumes"] if v["name"] == mount["name"]]
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    (item,) = [i for i in vol["configMap"]["items"] if i["path"] == mount["subPath"]]
    assert item["key"] in cm["data"]
    assert values["serviceMonitor"]["honorLabels"] is True

"""Deployment files: every manifest parses, the agent DaemonSet has the access it needs, the
PrometheusRule is the rendered rules and passes promtool, the scrape example passes promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cotenant.alerts.rules import exporters_rule, prometheus_rule, render_rules
from cotenant.config import Config
from cotenant.rules_cmd import settings_from

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
needs_promtool = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")


def _docs() -> list[dict[str, Any]]:
    out = []
    for p in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(p.read_text()):
            assert isinstance(d, dict) and d.get("apiVersion") and d.get("kind"), p
            assert d["metadata"]["name"], p
            out.append(d)
    return out


def _one(kind: str, name: str) -> dict[str, Any]:
    return next(d for d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name)


def test_every_manifest_parses_and_the_roles_are_there() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in _docs()}
    assert {
        ("DaemonSet", "cotenant-agent"),
        ("Deployment", "cotenant"),
        ("Service", "cotenant-agent"),
        ("Service", "cotenant"),
        ("ServiceMonitor", "cotenant-agent"),
        ("PrometheusRule", "cotenant"),
    } <= kinds


def test_the_agent_daemonset_sees_every_gpu_and_the_host_processes() -> None:
    spec = _one("DaemonSet", "cotenant-agent")["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    c = spec["containers"][0]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["COTENANT_PROCFS_ROOT"] == "/host/proc"
    assert env["COTENANT_AGENT_NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # no GPU allocated to the agent: it would hide the others
    assert "nvidia.com/gpu" not in str(c.get("resources", {}))
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/host/proc"]["readOnly"] is True
    assert c["args"] == ["agent"]
    # every COTENANT_ variable is a real key
    keys = {
        f"COTENANT_{section.upper()}_{k.upper()}"
        for section, sub in Config().to_dict().items()
        for k in sub
    }
    assert {n for n in env if n.startswith("COTENANT_")} <= keys


def test_the_agent_runs_as_its_service_account_allowed_to_list_pods_and_nothing_else() -> None:
    """agent-rbac.yaml: the DaemonSet's service account is bound to a role that lists pods
    (the API server's per-node pod list the agent reads) and grants nothing else."""
    ds = _one("DaemonSet", "cotenant-agent")
    spec, ns = ds["spec"]["template"]["spec"], ds["metadata"]["namespace"]
    account = spec["serviceAccountName"]
    assert spec.get("automountServiceAccountToken", True) is True  # the token it sends
    assert _one("ServiceAccount", account)["metadata"]["namespace"] == ns
    bindings = [
        d
        for d in _docs()
        if d["kind"] == "ClusterRoleBinding"
        and {"kind": "ServiceAccount", "name": account, "namespace": ns} in d["subjects"]
    ]
    assert [b["roleRef"]["kind"] for b in bindings] == ["ClusterRole"]
    role = _one("ClusterRole", bindings[0]["roleRef"]["name"])
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    assert not [d for d in _docs() if d["kind"] in ("Role", "RoleBinding")]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    url = env["COTENANT_PROCFS_KUBELET_PODS"]
    assert url == (
        "https://kubernetes.default.svc/api/v1/pods"
        "?fieldSelector=spec.nodeName=$(COTENANT_AGENT_NODE)"
    )
    names = [e["name"] for e in spec["containers"][0]["env"]]
    assert names.index("COTENANT_AGENT_NODE") < names.index("COTENANT_PROCFS_KUBELET_PODS")


def test_the_central_config_is_valid_and_reads_prometheus(tmp_path: Path) -> None:
    from cotenant.config import load_config

    cm = _one("ConfigMap", "cotenant-central")
    p = tmp_path / "c.toml"
    p.write_text(cm["data"]["cotenant.toml"])
    cfg = load_config(str(p), env={})
    assert cfg.prometheus.url.startswith("http://") and "{instance}" in (
        cfg.prometheus.agent_url_template
    )
    # each pass re-reads at least one rate window (4 scrapes): the newest windows move until then
    assert cfg.analysis.reread_s >= 4 * cfg.prometheus.scrape_interval_s


def test_the_prometheus_rule_is_the_rendered_rules() -> None:
    s = settings_from(Config())
    assert (K8S / "prometheusrule.yaml").read_text() == prometheus_rule(s), (
        "re-render: cotenant rules render --prometheus-rule deploy/k8s/prometheusrule.yaml"
    )
    groups = _one("PrometheusRule", "cotenant")["spec"]["groups"]
    rendered = render_rules(s)
    want = [
        g
        for f in ("cotenant.rules.yml", "fleet.rules.yml")
        for g in yaml.safe_load(rendered[f])["groups"]
    ]
    assert groups == want


def test_the_optional_exporters_rule_is_the_rendered_exporter_rules() -> None:
    s = settings_from(Config())
    path = K8S / "optional" / "prometheusrule-exporters.yaml"
    assert path.read_text() == exporters_rule(s), (
        "re-render: cotenant rules render --exporters-rule " + str(path.relative_to(ROOT))
    )
    [doc] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert doc["metadata"]["name"] == "cotenant-exporters"
    rendered = yaml.safe_load(render_rules(s)["exporters.rules.yml"])["groups"]
    assert doc["spec"]["groups"] == rendered
    alerts = {r["alert"] for g in rendered for r in g["rules"] if "alert" in r}
    assert {"ModelLatencySLOBreach", "GPUClockThrottled", "ExporterDown"} <= alerts


@needs_promtool
def test_promtool_checks_the_prometheus_rule_and_the_scrape_example(tmp_path: Path) -> None:
    # every PrometheusRule under deploy/, its groups as a rule file
    found = [
        d
        for p in sorted((ROOT / "deploy").rglob("*.yaml"))
        for d in yaml.safe_load_all(p.read_text())
        if d and d.get("kind") == "PrometheusRule"
    ]
    assert [d["metadata"]["name"] for d in found] == ["cotenant-exporters", "cotenant"]
    for i, doc in enumerate(found):
        rules = tmp_path / f"rules-{i}.yml"
        rules.write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}))
        r = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    # the example's rule_files point at /etc/prometheus/rules: check it with local copies
    cfg = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    for name in ("cotenant.rules.yml", "fleet.rules.yml"):
        shutil.copy(ROOT / "cotenant" / "rules" / name, tmp_path / name)
    cfg["rule_files"] = [str(tmp_path / "cotenant.rules.yml"), str(tmp_path / "fleet.rules.yml")]
    conf = tmp_path / "prometheus.yml"
    conf.write_text(yaml.safe_dump(cfg))
    r = subprocess.run([PROMTOOL, "check", "config", str(conf)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr

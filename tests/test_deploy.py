"""Deployment files: every manifest parses, the agent DaemonSet has the access it needs, the
PrometheusRule is the rendered rules and passes promtool, the scrape example passes promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cotenant.alerts.rules.render import exporters_rule, prometheus_rule, render_rules
from cotenant.app.central import check_prometheus_url
from cotenant.app.config import Config, load_config
from cotenant.cli.rules import settings_from
from cotenant.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl not installed (make system-deps installs kubernetes-client)"
)
needs_promtool = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")


def _docs() -> list[dict[str, Any]]:
    out = []
    for p in sorted(K8S.glob("*.yaml")):
        if p.name == "kustomization.yaml":
            continue
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
    from cotenant.app.config import load_config

    cm = _one("ConfigMap", "cotenant-central")
    p = tmp_path / "c.toml"
    p.write_text(cm["data"]["cotenant.toml"])
    url = "http://kps-kube-prom-prometheus.monitoring:9090"
    cfg = load_config(str(p), env={"COTENANT_PROMETHEUS_URL": url})
    assert cfg.prometheus.url == url and "{instance}" in cfg.prometheus.agent_url_template
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


@needs_kubectl
def test_one_apply_builds_every_manifest_with_the_namespace_first() -> None:
    """``kubectl apply -k deploy/k8s``: kubectl's kustomize builds every file of the folder,
    the Namespace first and the objects the workloads name before them (kubectl 1.20's
    kustomize v2 as well as today's v5: Debian 12's kubectl is the oldest a clean machine
    gets)."""
    r = subprocess.run(
        [str(KUBECTL), "kustomize", str(K8S)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    built = [d for d in yaml.safe_load_all(r.stdout) if d]
    kinds = [d["kind"] for d in built]
    assert kinds[0] == "Namespace", kinds
    first = {k: kinds.index(k) for k in reversed(kinds)}
    assert first["ServiceAccount"] < first["DaemonSet"]
    assert first["ConfigMap"] < first["Deployment"]
    namespaces = {d["metadata"]["name"] for d in built if d["kind"] == "Namespace"}
    for d in built:
        ns = d["metadata"].get("namespace")
        assert ns is None or ns in namespaces, (d["kind"], d["metadata"]["name"])
    # every file of the folder is in the kustomization: one apply is the whole deployment
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert set(listed) == files and listed[0] == "namespace.yaml"
    names = {(d["kind"], d["metadata"]["name"]) for d in built}
    assert {(d["kind"], d["metadata"]["name"]) for d in _docs()} <= names
    # the wiring ConfigMap is generated (its name hashed) and central reads it
    [wiring] = [d for d in built if d["metadata"]["name"].startswith("cotenant-wiring")]
    deploy = next(d for d in built if d["kind"] == "Deployment")
    refs = deploy["spec"]["template"]["spec"]["containers"][0]["envFrom"]
    assert {"configMapRef": {"name": wiring["metadata"]["name"]}} in refs
    # and every object it builds passes the API's schema
    import kubernetes_validate

    for d in built:
        if d["apiVersion"].startswith("monitoring.coreos.com"):
            continue  # CRDs: tests/test_manifest_schemas.py
        kubernetes_validate.validate(d, kubernetes_validate.utils.latest_version(), strict=True)


def test_no_prometheus_url_or_release_label_is_hard_coded(tmp_path: Path) -> None:
    """The Prometheus URL comes from wiring.env, empty as shipped, and central refuses to
    start without it; no manifest carries a guess at the operator's Helm release label."""
    env = {}
    for line in (K8S / "wiring.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            k, _, v = line.partition("=")
            env[k] = v
    assert env == {"COTENANT_PROMETHEUS_URL": ""}
    cm = _one("ConfigMap", "cotenant-central")["data"]["cotenant.toml"]
    assert "url =" not in cm.replace("agent_url_template", "")
    toml = tmp_path / "central.toml"
    toml.write_text(cm)
    with pytest.raises(ConfigError, match=r"prometheus\.required is true"):
        check_prometheus_url(load_config(str(toml), env=env))
    for f in sorted((ROOT / "deploy").rglob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            labels = ((d or {}).get("metadata") or {}).get("labels") or {}
            assert "release" not in labels, f


def _pod(kind: str, name: str) -> dict[str, Any]:
    return dict(_one(kind, name)["spec"]["template"]["spec"])


def test_pods_drop_every_capability_and_run_under_seccomp_as_non_root() -> None:
    """Pod Security "restricted" for central; the same for the agent but its hostPID and
    host /proc, which is why the namespace enforces "privileged" (and says why)."""
    ns = _one("Namespace", "cotenant")["metadata"]["labels"]
    assert ns["pod-security.kubernetes.io/enforce"] == "privileged"
    assert "pod-security.kubernetes.io/audit" in ns
    for kind, name in (("Deployment", "cotenant"), ("DaemonSet", "cotenant-agent")):
        pod = _pod(kind, name)
        sc = pod["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            csc = c["securityContext"]
            assert csc["capabilities"] == {"drop": ["ALL"]}, (name, c["name"])
            assert csc["allowPrivilegeEscalation"] is False
            assert csc["readOnlyRootFilesystem"] is True
    central = _pod("Deployment", "cotenant")
    assert not central.get("hostPID") and not central.get("hostNetwork")
    assert all("hostPath" not in v for v in central["volumes"])
    agent = _pod("DaemonSet", "cotenant-agent")
    host = [v for v in agent["volumes"] if "hostPath" in v]
    assert [v["hostPath"]["path"] for v in host] == ["/proc"]


def test_the_agents_priority_class_is_ours_not_a_system_one() -> None:
    agent = _pod("DaemonSet", "cotenant-agent")
    pc = _one("PriorityClass", agent["priorityClassName"])
    assert not agent["priorityClassName"].startswith("system-")
    assert 0 < pc["value"] < 1_000_000_000 and pc["globalDefault"] is False


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_network_policies_open_only_the_ports_the_pods_serve() -> None:
    policies = [d for d in _docs() if d["kind"] == "NetworkPolicy"]
    assert any(p["spec"]["podSelector"] == {} and "ingress" not in p["spec"] for p in policies)
    for kind, name in (("Deployment", "cotenant"), ("DaemonSet", "cotenant-agent")):
        tpl = _one(kind, name)["spec"]["template"]
        labels = tpl["metadata"]["labels"]
        served = {p["containerPort"] for c in tpl["spec"]["containers"] for p in c["ports"]}
        opened = {
            port["port"]
            for p in policies
            if p["spec"]["podSelector"] and _selects(p["spec"]["podSelector"], labels)
            for rule in p["spec"].get("ingress", [])
            for port in rule["ports"]
        }
        assert opened == served, (name, opened, served)


def test_central_has_a_disruption_budget() -> None:
    pdb = _one("PodDisruptionBudget", "cotenant")
    labels = _one("Deployment", "cotenant")["spec"]["template"]["metadata"]["labels"]
    assert _selects(pdb["spec"]["selector"], labels)
    assert "maxUnavailable" in pdb["spec"] or "minAvailable" in pdb["spec"]


def test_the_dcgm_exporter_runs_in_per_pod_mode_with_host_pids() -> None:
    docs = list(yaml.safe_load_all((ROOT / "deploy/dcgm-exporter/dcgm-exporter.yaml").read_text()))
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["KUBERNETES_VIRTUAL_GPUS"] == "true" and env["DCGM_EXPORTER_KUBERNETES"] == "true"
    values = yaml.safe_load((ROOT / "deploy/dcgm-exporter/helm-values.yaml").read_text())
    assert {"name": "KUBERNETES_VIRTUAL_GPUS", "value": "true"} in values["extraEnv"]

"""Every manifest under deploy/ against the schemas the cluster applies, offline.

Kubernetes' own kinds go through ``kubernetes-validate`` (the API's OpenAPI schemas, strict:
an unknown field is an error, as with ``kubectl apply --validate=strict``) at the oldest and
the newest Kubernetes version we document; ServiceMonitor and PrometheusRule go through
prometheus-operator's CRD schemas, vendored in ``tests/fixtures/crds/`` (README there: version
and source), made strict the way the API server's field validation is (an object with declared
properties takes no other field, unless it preserves unknown fields). The PrometheusRule's
expressions go through promtool in ``tests/test_deploy.py``.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CRDS = Path(__file__).with_name("fixtures") / "crds"
# the oldest Kubernetes docs/fleet-install.md names (internalTrafficPolicy, sizeLimit,
# runtimeClassName are GA there) and the newest kubernetes-validate ships
K8S_VERSIONS = ("1.27", kubernetes_validate.utils.latest_version())
CRD_FILES = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
}
# YAML files under deploy/ that are not Kubernetes objects, and the test that checks each
NOT_MANIFESTS = {
    "prometheus/prometheus.yml": "tests/test_deploy.py (promtool check config)",
    "dcgm-exporter/helm-values.yaml": "tests/test_dcgm_counters.py (the chart's values)",
    "k8s/kustomization.yaml": "tests/test_deploy.py (kubectl kustomize builds it)",
}


def _manifests() -> list[tuple[str, int, dict[str, Any]]]:
    out = []
    for p in sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]):
        rel = p.relative_to(DEPLOY).as_posix()
        if rel in NOT_MANIFESTS:
            continue
        for i, doc in enumerate(yaml.safe_load_all(p.read_text())):
            if doc is not None:
                out.append((rel, i, doc))
    return out


MANIFESTS = _manifests()


def _strict(schema: Any) -> Any:
    """The CRD schema with ``additionalProperties: false`` on every object that declares its
    properties and neither allows extra ones nor preserves unknown fields (what the API
    server's strict field validation rejects; it prunes them silently otherwise), and its Go
    regular expressions made Python's."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if isinstance(out.get("pattern"), str) and out["pattern"].startswith("^(?i)"):
        # Go's regexp takes a flag group anywhere; Python's only at the start
        out["pattern"] = "(?i)^" + out["pattern"][len("^(?i)") :]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((CRDS / CRD_FILES[(api_version, kind)]).read_text())
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = _strict(v["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _errors(doc: dict[str, Any], k8s: str) -> list[str]:
    """Every schema error in ``doc`` (empty when it is valid), each as ``path: message``."""
    key = (doc.get("apiVersion", ""), doc.get("kind", ""))
    if key in CRD_FILES:
        errs = [
            f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in _crd_validator(*key).iter_errors(doc)
        ]
        # the CRD leaves metadata to the API server: check it as any object's ObjectMeta
        meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc.get("metadata")}
        return errs + _errors(meta, k8s)
    try:
        kubernetes_validate.validate(doc, k8s, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"]
    return []


def test_deploy_holds_the_manifests_we_ship() -> None:
    for f, i, d in MANIFESTS:
        assert d.get("apiVersion") and d.get("kind"), f"{f}#{i} is not a Kubernetes object"
    kinds = {d["kind"] for _, _, d in MANIFESTS}
    assert {"DaemonSet", "Deployment", "Service", "ServiceMonitor", "PrometheusRule"} <= kinds
    for rel in NOT_MANIFESTS:
        assert (DEPLOY / rel).exists(), rel


@pytest.mark.parametrize("k8s", K8S_VERSIONS)
@pytest.mark.parametrize(
    "where,doc", [(f"{f}#{i}", d) for f, i, d in MANIFESTS], ids=lambda x: str(x)[:40]
)
def test_every_manifest_matches_its_schema(where: str, doc: dict[str, Any], k8s: str) -> None:
    try:
        errs = _errors(doc, k8s)
    except kubernetes_validate.SchemaNotFoundError as e:
        pytest.fail(f"{where}: no schema for {doc.get('apiVersion')} {doc.get('kind')}: {e}")
    assert errs == [], f"{where} ({doc['kind']} {doc['metadata'].get('name')}): {errs}"


def _one(kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(d for _, _, d in MANIFESTS if d["kind"] == kind))


@pytest.mark.parametrize(
    "kind,typo,where",
    [
        (
            "ServiceMonitor",
            lambda d: d["spec"]["endpoints"][0].update(intervall="15s"),
            "intervall",
        ),
        ("ServiceMonitor", lambda d: d["spec"].update(selecter={}), "selecter"),
        (
            "PrometheusRule",
            lambda d: d["spec"]["groups"][0]["rules"][0].update(expres="up"),
            "expres",
        ),
        ("PrometheusRule", lambda d: d["metadata"].update(lables={"a": "b"}), "lables"),
        (
            "DaemonSet",
            lambda d: d["spec"]["template"]["spec"].update(hostPid=True),
            "hostPid",
        ),
        (
            "Deployment",
            lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imagePullPolcy="x"),
            "imagePullPolcy",
        ),
    ],
)
def test_a_typo_in_a_field_name_is_caught(kind: str, typo: Any, where: str) -> None:
    doc = _one(kind)
    assert _errors(doc, K8S_VERSIONS[-1]) == []
    typo(doc)
    errs = _errors(doc, K8S_VERSIONS[-1])
    assert errs, f"{kind}: the typo passed"
    assert any(where in e for e in errs), errs


def test_a_wrong_type_is_caught() -> None:
    doc = _one("ServiceMonitor")
    doc["spec"]["endpoints"][0]["honorLabels"] = "yes"
    assert any("honorLabels" in e and "boolean" in e for e in _errors(doc, K8S_VERSIONS[-1]))

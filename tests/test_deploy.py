"""deploy/: every manifest validates against the Kubernetes schemas (kubernetes-validate),
the kustomization names every file, the generated PrometheusRule and dashboard ConfigMaps
equal what alerts/ and grafana/ hold, and RBAC grants exactly the verbs the code uses."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from alerts.rules import rules_document
from deploy import generate
from exporter.sources.kube import API_USE as EXPORTER_API_USE
from grafana import dashboards
from remediator.kube import API_USE as REMEDIATOR_API_USE

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
K8S_VERSION = "1.31.0"
CRDS = {"ServiceMonitor", "PrometheusRule", "Kustomization"}


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifests() -> list[tuple[str, dict]]:
    out = []
    for path in sorted((DEPLOY / "base").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            out += [(path.name, d) for d in documents(path)]
    return out


def test_generated_manifests_are_current():
    for name, text in generate.files().items():
        assert (DEPLOY / "base" / name).read_text() == text, "run: make docs"


@pytest.mark.parametrize(
    ("name", "doc"), manifests(), ids=lambda x: x if isinstance(x, str) else x.get("kind")
)
def test_every_manifest_validates(name, doc):
    if doc["kind"] in CRDS:
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert doc["metadata"]["namespace"] == "numaguard" and doc["spec"]
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kustomizations_name_every_file():
    base = documents(DEPLOY / "base" / "kustomization.yaml")[0]
    listed = set(base["resources"])
    present = {p.name for p in (DEPLOY / "base").glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present
    enforce = documents(DEPLOY / "overlays" / "enforce" / "kustomization.yaml")[0]
    assert enforce["resources"] == ["../../base"]
    assert "--no-dry-run" in enforce["patches"][0]["patch"]
    # and the base runs the remediator in dry-run
    (deployment,) = [d for n, d in manifests() if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-dry-run" not in args and deployment["spec"]["replicas"] == 2


def test_prometheus_rule_and_dashboards_equal_their_sources():
    (rule,) = [d for n, d in manifests() if d["kind"] == "PrometheusRule"]
    assert rule["spec"] == rules_document()
    maps = {
        d["metadata"]["name"]: d
        for n, d in manifests()
        if d["kind"] == "ConfigMap"
        and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
    }
    assert set(maps) == {d.uid for d in dashboards.DASHBOARDS}
    for uid, cm in maps.items():
        assert json.loads(cm["data"][f"{uid}.json"]) == json.loads(
            (dashboards.HERE / f"{uid}.json").read_text()
        )


def granted(account: str) -> set[tuple[str, str, str]]:
    roles = {
        d["metadata"]["name"]: d for _, d in manifests() if d["kind"] in ("ClusterRole", "Role")
    }
    out = set()
    for _, d in manifests():
        if d["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s["name"] == account for s in d["subjects"]):
            continue
        for rule in roles[d["roleRef"]["name"]]["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out |= {(group, resource, verb) for verb in rule["verbs"]}
    return out


def test_rbac_grants_exactly_what_the_code_uses():
    assert granted("numaguard-exporter") == EXPORTER_API_USE
    assert granted("numaguard-remediator") == REMEDIATOR_API_USE

"""The Helm chart (deploy/helm/numaguard): `helm lint --strict` is clean, every object it
renders validates, and with its defaults and its switches it renders what the kustomize
base and overlays do (but the Namespace, which `helm install --create-namespace` makes)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from numaguard.simulator.controlplane import rendered
from tests.test_deploy import CRDS, DEPLOY, K8S_VERSION

# kubectl kustomize and helm come from the control plane's build
pytestmark = pytest.mark.cluster

CHART = DEPLOY / "helm" / "numaguard"
CHART_ONLY_ANNOTATIONS = {"checksum/config"}  # rolls the remediator when its config changes


def helm_binary() -> str:
    """The helm `make helm` built from the version tests/helm/go.mod pins."""
    text = (Path(__file__).parent / "helm" / "go.mod").read_text()
    version = re.search(r"helm\.sh/helm/v3 (v[0-9.]+)", text)[1]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    path = Path(cache) / "numaguard" / f"helm-{version}" / "helm"
    assert path.is_file(), f"{path} is missing: run make helm"
    return str(path)


def template(*sets: str) -> list[dict]:
    args = [helm_binary(), "template", "numaguard", str(CHART), "--namespace", "numaguard"]
    args += ["--kube-version", "1.37.0"]  # what the test control plane runs
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def comparable(docs: list[dict]) -> dict[tuple[str, str], dict]:
    """By kind and name, with what only the chart adds taken out and the remediator's
    config read as data (its comments differ)."""
    out = {}
    for doc in docs:
        if doc["kind"] == "Namespace":
            continue
        if doc["kind"] == "ConfigMap" and "config.yaml" in doc.get("data", {}):
            doc["data"]["config.yaml"] = yaml.safe_load(doc["data"]["config.yaml"])
        template = doc.get("spec", {}).get("template", {}).get("metadata", {})
        for key in CHART_ONLY_ANNOTATIONS:
            template.get("annotations", {}).pop(key, None)
        if template.get("annotations") == {}:
            del template["annotations"]
        out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def test_helm_lint_is_clean():
    lint = subprocess.run(
        [helm_binary(), "lint", "--strict", str(CHART)], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "0 chart(s) failed" in lint.stdout


@pytest.mark.parametrize(
    ("sets", "overlay"),
    [
        ((), "base"),
        (("remediator.enforce=true",), "overlays/enforce"),
        (("exporter.resctrlManage=true",), "overlays/resctrl-manage"),
        (("webConfig.kubernetesAuth=true",), "overlays/kubernetes-auth"),
        (("exporter.nrt=true",), "overlays/nrt"),
    ],
)
def test_the_chart_renders_what_kustomize_does(sets, overlay):
    chart, kustomized = comparable(template(*sets)), comparable(rendered(overlay))
    assert set(chart) == set(kustomized)
    for key, doc in chart.items():
        assert doc == kustomized[key], key


def test_every_object_validates_with_every_switch_on():
    docs = template(
        "remediator.enforce=true",
        "exporter.resctrlManage=true",
        "exporter.nrt=true",
        "webConfig.secretName=numaguard-web",
        "webConfig.kubernetesAuth=true",
        "serviceMonitor.scheme=https",
        "image.tag=0.1.1",
        "image.pullPolicy=Always",
    )
    for doc in docs:
        if doc["kind"] not in CRDS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert "--web.config.file=/etc/numaguard/web/web-config.yml" in container["args"]
    assert container["image"] == "ghcr.io/numaguard/numaguard-exporter:0.1.1"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    (monitor,) = [
        d for d in docs if d["kind"] == "ServiceMonitor" and d["metadata"]["name"] == "numaguard"
    ]
    assert monitor["spec"]["endpoints"][0]["scheme"] == "https"


def test_switches_off_leave_their_objects_out():
    docs = template(
        "serviceMonitor.enabled=false",
        "prometheusRule.enabled=false",
        "dashboards.enabled=false",
        "networkPolicy.enabled=false",
    )
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ServiceMonitor", "PrometheusRule", "NetworkPolicy"}
    assert not [d for d in docs if d["kind"] == "ConfigMap" and "grafana_dashboard" in str(d)]

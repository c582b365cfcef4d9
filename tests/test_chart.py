"""The Helm chart (deploy/helm/numaguard): `helm lint --strict` is clean, every object it
renders validates, and with its defaults and its switches it renders what the kustomize
base and overlays do (but the Namespace, which `helm install --create-namespace` makes)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from numaguard.remediator.arguments import parser as remediator_parser
from numaguard.remediator.config import ConfigError, settings
from numaguard.simulator.parts.controlplane import rendered
from numaguard.simulator.parts.processes import until
from tests.helpers.deploy import CRDS, DEPLOY, K8S_VERSION
from tests.helpers.tenants import namespace_admin

# kubectl kustomize and helm come from the control plane's build
pytestmark = pytest.mark.cluster

CHART = DEPLOY / "helm" / "numaguard"
CHART_ONLY_ANNOTATIONS = {"checksum/config"}  # rolls the remediator when its config changes
# Kubernetes' recommended labels that name a Helm release (the base has no release)
CHART_ONLY_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
}


def without_chart_labels(value):
    if isinstance(value, dict):
        return {k: without_chart_labels(v) for k, v in value.items() if k not in CHART_ONLY_LABELS}
    if isinstance(value, list):
        return [without_chart_labels(v) for v in value]
    return value


def helm_binary() -> str:
    """The helm `make helm` built from the version tests/helm/go.mod pins."""
    text = (Path(__file__).parent / "helm" / "go.mod").read_text()
    version = re.search(r"helm\.sh/helm/v3 (v[0-9.]+)", text)[1]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    path = Path(cache) / "numaguard" / f"helm-{version}" / "helm"
    assert path.is_file(), f"{path} is missing: run make helm"
    return str(path)


def template(*sets: str, release: str = "numaguard", namespace: str = "numaguard") -> list[dict]:
    args = [helm_binary(), "template", release, str(CHART), "--namespace", namespace]
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
        out[(doc["kind"], doc["metadata"]["name"])] = without_chart_labels(doc)
    return out


def test_helm_lint_is_clean():
    lint = subprocess.run(
        [helm_binary(), "lint", "--strict", str(CHART)], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "0 chart(s) failed" in lint.stdout


@pytest.mark.parametrize(
    ("sets", "components"),
    [
        ((), ()),
        (("remediator.dryRun=false",), ("no-dry-run",)),
        (("exporter.resctrlManage=true",), ("resctrl-manage",)),
        (("webConfig.kubernetesAuth=true",), ("kubernetes-auth",)),
        (("exporter.nrt=true",), ("nrt",)),
        (("exporter.kubeletConfig=/var/lib/kubelet/config.yaml",), ("kubelet-config",)),
        (("exporter.detail=true",), ("detail",)),
        (("exporter.memoryMover=true",), ("memory-mover",)),
        (("remediator.steering.enabled=true",), ("steering",)),
        (("remediator.migLayout.enabled=true",), ("mig-layout",)),
        (
            ("networkPolicy.enabled=true", "networkPolicy.prometheusNamespace=monitoring"),
            ("network-policy",),
        ),
    ],
)
def test_the_chart_renders_what_kustomize_does(sets, components):
    chart, kustomized = comparable(template(*sets)), comparable(rendered(*components))
    assert set(chart) == set(kustomized)
    for key, doc in chart.items():
        assert doc == kustomized[key], key


# what a platform team sets beside kube-prometheus-stack and the GPU Operator, and
# every switch on
EVERY_SWITCH = (
    "remediator.dryRun=false",
    "remediator.steering.enabled=true",
    "remediator.migLayout.enabled=true",
    "exporter.resctrlManage=true",
    "exporter.nrt=true",
    "exporter.kubeletConfig=/var/lib/kubelet/config.yaml",
    "exporter.detail=true",
    "exporter.memoryMover=true",
    "webConfig.secretName=numaguard-web",
    "webConfig.kubernetesAuth=true",
    "serviceMonitor.scheme=https",
    "serviceMonitor.additionalLabels.release=prom",
    "serviceMonitor.scrapeTimeout=10s",
    "serviceMonitor.metricRelabelings[0].action=labeldrop",
    "serviceMonitor.metricRelabelings[0].regex=python_version",
    "prometheusRule.additionalLabels.release=prom",
    "networkPolicy.enabled=true",
    "networkPolicy.prometheusNamespace=observability",
    "image.tag=0.1.1",
    "image.pullPolicy=Always",
    "imagePullSecrets[0].name=registry",
    "commonLabels.team=ml-infra",
    "exporter.image.digest=sha256:" + "0" * 64,
    "exporter.extraArgs[0]=--collector.resctrl=false",
    "exporter.podAnnotations.example\\.com/scrape=no",
    "remediator.tolerations[0].operator=Exists",
    "remediator.serviceAccount.annotations.example\\.com/role=x",
)


def test_every_object_validates_with_every_switch_on():
    docs = template(*EVERY_SWITCH)
    for doc in docs:
        if doc["kind"] not in CRDS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    daemonset, rdt = [d for d in docs if d["kind"] == "DaemonSet"]  # resctrlManage: two
    assert rdt["metadata"]["name"] == "numaguard-exporter-rdt"
    container, helper = daemonset["spec"]["template"]["spec"]["containers"]  # memoryMover
    assert helper["name"] == "memory-mover" and helper["image"] == container["image"]
    # both run the same exporter; only the -rdt one's resctrl is writable
    assert rdt["spec"]["template"]["spec"]["containers"][0]["args"] == container["args"]
    assert "--web.config.file=/etc/numaguard/web/web-config.yml" in container["args"]
    assert container["image"] == "ghcr.io/numaguard/numaguard-exporter:0.1.1@sha256:" + "0" * 64
    assert container["args"][-1] == "--collector.resctrl=false"
    pod = daemonset["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"example.com/scrape": "no"}
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry"}]
    for doc in docs:
        assert doc["metadata"]["labels"]["team"] == "ml-infra", doc["kind"]
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


def test_a_value_the_chart_does_not_have_is_refused():
    """values.schema.json: a typo, or a value of another chart's layout, fails the
    install with the key named, instead of being silently ignored."""
    for typo, said in (
        ("exporter.nodeSelectr.a=b", "'nodeSelectr' not allowed"),
        ("nodeSelector.a=b", "'nodeSelector' not allowed"),
        ("remediator.enforce=true", "'enforce' not allowed"),
        ("networkPolicy.enabled=true", "/networkPolicy/prometheusNamespace"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
    ):
        with pytest.raises(subprocess.CalledProcessError) as failed:
            template(typo)
        assert said in failed.value.stderr, (typo, failed.value.stderr)


def test_helm_template_works_offline_with_helm_s_own_defaults():
    args = [helm_binary(), "template", "numaguard", str(CHART)]
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def names(docs: list[dict]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def test_names_follow_the_release_and_each_component_can_be_left_out():
    default = names(template())
    staging = names(template(release="staging"))
    assert not default & staging  # nothing of one release is the other's, cluster-wide too
    assert all(name.startswith("staging-numaguard") for _, name in staging)
    assert names(template("fullnameOverride=ng")) == {
        (kind, name.replace("numaguard", "ng", 1)) for kind, name in default
    }
    exporter_only = template("remediator.enabled=false")
    assert not [name for _, name in names(exporter_only) if "remediator" in name]
    assert ("DaemonSet", "numaguard-exporter") in names(exporter_only)
    remediator_only = template("exporter.enabled=false")
    assert not [name for _, name in names(remediator_only) if "exporter" in name]
    assert ("Deployment", "numaguard-remediator") in names(remediator_only)


def test_the_network_policy_selects_only_this_release_s_pods():
    docs = template(
        "networkPolicy.enabled=true",
        "networkPolicy.prometheusNamespace=observability",
        release="ng",
        namespace="monitoring",
    )
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector == {
        "app.kubernetes.io/part-of": "numaguard",
        "app.kubernetes.io/instance": "ng",
    }
    pods = [
        d["spec"]["template"]["metadata"]["labels"] for d in docs if "template" in d.get("spec", {})
    ]
    assert len(pods) == 2 and all(selector.items() <= labels.items() for labels in pods)
    source = policy["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]
    assert source == {"kubernetes.io/metadata.name": "observability"}


def test_two_releases_install_side_by_side_on_the_real_api_server(control_plane, tmp_path):
    """helm install with every switch on and kube-prometheus-stack-style values, twice,
    into one namespace that is not `numaguard`, on the real API server with the
    Prometheus Operator's CRDs and deploy/'s kustomize install already there: every
    object accepted, none shared, the notes say the mode; uninstalled, nothing of either
    is left."""
    from numaguard.simulator.parts.operator import install_crds

    cp = control_plane
    kubeconfig = cp.kubeconfig(tmp_path / "admin.kubeconfig", cp.admin_token)
    env = {
        **os.environ,
        "KUBECONFIG": kubeconfig,
        **{f"HELM_{d}_HOME": str(tmp_path / d) for d in ("CACHE", "CONFIG", "DATA")},
    }
    install_crds(cp, kubeconfig)
    kubectl = [str(cp.bin / "kubectl"), f"--kubeconfig={kubeconfig}"]
    namespace = "gpu-observability"

    def helm(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([helm_binary(), *args], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        return done

    def installed(release: str) -> list[dict]:
        text = helm("get", "manifest", release, "-n", namespace).stdout
        return [d for d in yaml.safe_load_all(text) if d]

    def on_the_server(docs: list[dict]) -> list[dict]:
        manifest = tmp_path / "manifest.yaml"
        manifest.write_text(yaml.safe_dump_all(docs))
        argv = [*kubectl, "get", "-f", str(manifest), "--ignore-not-found", "-o", "json"]
        got = json.loads(subprocess.run(argv, check=True, capture_output=True).stdout or "{}")
        return got.get("items", [got] if got.get("kind") not in (None, "List") else [])

    # both move memory: seen, each release's policy refused the other's remediator
    releases = {
        "gpu": EVERY_SWITCH,
        "staging": ("remediator.replicas=1", "exporter.memoryMover=true"),
    }
    objects: list[dict] = []
    try:
        notes = {}
        for release, sets in releases.items():
            args = ["install", release, str(CHART), "-n", namespace, "--create-namespace"]
            notes[release] = helm(*args, *(a for s in sets for a in ("--set", s))).stdout
            objects += installed(release)
        assert "The remediator ACTS" in notes["gpu"]
        assert "The remediator is in DRY-RUN" in notes["staging"]
        assert "kubectl get events -A --field-selector reason=DryRun" in notes["staging"]
        # the notes' command to leave dry run works as printed, from the checkout's root
        # (seen: `helm upgrade staging numaguard` took the Python package's folder)
        (upgrade,) = [ln.split() for ln in notes["staging"].splitlines() if "helm upgrade" in ln]
        done = subprocess.run(
            [helm_binary(), *upgrade[1:], "--dry-run"],
            capture_output=True,
            text=True,
            env=env,
            cwd=DEPLOY.parent,
        )
        assert done.returncode == 0 and "The remediator ACTS" in done.stdout, done.stderr
        first, second = installed("gpu"), installed("staging")
        assert not names(first) & names(second)
        assert {"ValidatingAdmissionPolicy", "NetworkPolicy", "ServiceMonitor"} <= {
            d["kind"] for d in first
        }
        served = on_the_server(objects)  # each object is on the API server, as its release's
        assert names(served) == names(objects)
        for doc in served:
            assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] in releases
        # with both releases' policies in force, the acting one's remediator asks a
        # pod's node to move its memory, and a namespace's admin may not
        (account,) = [
            d["metadata"]["name"]
            for d in first
            if d["kind"] == "ServiceAccount" and d["metadata"]["name"].endswith("-remediator")
        ]
        tenant = tmp_path / "tenant.yaml"
        tenant.write_text(yaml.safe_dump_all(namespace_admin(namespace, "tenant")))
        subprocess.run([*kubectl, "apply", "-f", str(tenant)], check=True, capture_output=True)
        subprocess.run(
            [*kubectl, "run", "asks", "-n", namespace, "--image=busybox", "--restart=Never"],
            check=True,
            capture_output=True,
        )
        objects.append({"kind": "Pod", "metadata": {"name": "asks", "namespace": namespace}})

        def asks(who: str) -> bool:
            token = subprocess.run(
                [*kubectl, "create", "token", who, "-n", namespace],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            request = {"metadata": {"annotations": {"numaguard.io/move-memory": "1800000000"}}}
            patch = ["patch", "pod", "asks", "-n", namespace, "--type=merge", "--dry-run=server"]
            done = subprocess.run(
                [*kubectl, f"--token={token}", *patch, "-p", json.dumps(request)],
                capture_output=True,
                text=True,
            )
            assert done.returncode == 0 or "Forbidden" in done.stderr, done.stderr
            return done.returncode == 0

        async def refused() -> bool:
            return not await asyncio.to_thread(asks, "tenant")

        asyncio.run(until(refused, "the admission policies in force", 60))
        assert asks(account)
    finally:
        for release in releases:
            subprocess.run(
                [helm_binary(), "uninstall", release, "-n", namespace, "--wait"],
                capture_output=True,
                env=env,
            )
    assert on_the_server(objects) == []


def test_the_readme_s_image_command_builds_and_pushes_what_the_chart_runs():
    """`make image push IMAGE=...` as the README writes it (run with `make -n`, as a
    container engine would be told): the tags it builds and pushes are the images the
    chart runs with `image.repository` set to that IMAGE."""
    readme = (DEPLOY.parent / "README.md").read_text()
    (line,) = [ln for ln in readme.splitlines() if ln.startswith("make image push ")]
    args = line.split("#", 1)[0].split()[1:]
    image = next(a.split("=", 1)[1] for a in args if a.startswith("IMAGE="))
    done = subprocess.run(
        ["make", "-n", *args, "ENGINE=docker"],
        cwd=DEPLOY.parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    built = set(re.findall(r"docker build .* -t (\S+) \.", done.replace("$role", "{role}")))
    pushed = set(re.findall(r"for image in ([^;]+); do docker push", done)[0].split())
    assert len(pushed) == 2 and len(built) == 1  # one build command, a tag per role
    run = {
        c["image"]
        for d in template(f"image.repository={image}")
        if d["kind"] in ("DaemonSet", "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert run == pushed
    assert {b.format(role=r) for b in built for r in ("exporter", "remediator")} == pushed
    refused = subprocess.run(
        ["make", "image", f"IMAGE={image}:0.1.0", "ENGINE=docker"],
        cwd=DEPLOY.parent,
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0
    assert f"give the repository alone (IMAGE={image})" in refused.stdout


def test_the_alerts_runbook_urls_can_point_elsewhere():
    (rule,) = [
        d
        for d in template("prometheusRule.runbookUrl=https://wiki.example/numaguard/")
        if d["kind"] == "PrometheusRule"
    ]
    urls = [
        r["annotations"]["runbook_url"]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    ]
    assert urls and all(u.startswith("https://wiki.example/numaguard/Numaguard") for u in urls)
    assert "https://wiki.example/numaguard/NumaguardExporterDown.md" in urls


def test_the_alerts_link_their_dashboard_in_your_grafana():
    (rule,) = [
        d
        for d in template("prometheusRule.grafanaUrl=https://grafana.example/")
        if d["kind"] == "PrometheusRule"
    ]
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    for r in alerts:
        uid = r["annotations"]["dashboard_uid"]
        assert r["annotations"]["dashboard_url"] == f"https://grafana.example/d/{uid}", r
    assert {r["annotations"]["dashboard_uid"] for r in alerts} >= {"numaguard-node"}
    (plain,) = [d for d in template() if d["kind"] == "PrometheusRule"]
    assert "dashboard_url" not in str(plain)


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("remediator.config.policy.max_per_cycel=5", "'max_per_cycel' not allowed"),
        ("remediator.config.polcy.dry_run=false", "'polcy' not allowed"),
        ("remediator.config.windows.finding=forever", "does not match pattern"),
        ("remediator.config.policy.max_per_cycle=-1", "minimum"),
    ],
)
def test_a_wrong_remediator_setting_fails_the_install_not_the_pod(setting, said, tmp_path):
    """Seen: a typo'd key passed `helm install` and the remediator crash-looped on it.
    The schema is the remediator's own (pydantic's), and it refuses what the remediator
    refuses."""
    done = subprocess.run(
        [helm_binary(), "template", "x", str(CHART), "--set", setting],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and said in done.stderr, done.stderr
    # the remediator, given the same file, says no too
    key, value = setting.removeprefix("remediator.config.").split("=")
    section, name = key.split(".")
    config = yaml.safe_load((CHART / "values.yaml").read_text())["remediator"]["config"]
    config.setdefault(section, {})[name] = yaml.safe_load(value)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    args = remediator_parser().parse_args(["plan", "--config", str(tmp_path / "config.yaml")])
    with pytest.raises(ConfigError):
        settings(args)


def test_the_remediator_config_the_chart_ships_is_one_it_takes(tmp_path):
    sets = ("remediator.config.policy.max_per_cycle=3", "remediator.config.windows.finding=15m")
    (configmap,) = [
        d for d in template(*sets) if d["kind"] == "ConfigMap" and "config.yaml" in d["data"]
    ]
    (tmp_path / "config.yaml").write_text(configmap["data"]["config.yaml"])
    args = remediator_parser().parse_args(["plan", "--config", str(tmp_path / "config.yaml")])
    policy, _, windows, _ = settings(args)
    assert (policy.max_per_cycle, windows.finding) == (3, "15m")

"""deploy/: every manifest validates against the Kubernetes schemas (kubernetes-validate),
the kustomization names every file, the generated PrometheusRule and dashboard ConfigMaps
equal what alerts/ and grafana/ hold, and RBAC grants exactly the verbs the code uses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from alerts.rules import rules_document
from deploy import generate
from grafana import dashboards
from numaguard.exporter.publishers.nrt import API_USE as NRT_API_USE
from numaguard.exporter.settings import Settings
from numaguard.exporter.sources.kube import API_USE as EXPORTER_API_USE
from numaguard.remediator.kube import API_USE as REMEDIATOR_API_USE
from numaguard.remediator.kube import (
    DRY_RUN_API_USE,
    ENFORCE_API_USE,
    MIG_LAYOUT_API_USE,
    STEERING_API_USE,
)
from numaguard.simulator.parts.controlplane import kustomized, rendered
from tests.helpers.deploy import CRDS, DEPLOY, K8S_VERSION

# kubectl kustomize and helm come from the control plane's build
pytestmark = pytest.mark.cluster


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifests() -> list[tuple[str, dict]]:
    out = []
    for path in sorted((DEPLOY / "base").rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            out += [(path.name, d) for d in documents(path)]
    return out


def listed_here(folder: Path) -> set[str]:
    """What a kustomization's resources must name: its YAML files and its folders."""
    files = {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
    return files | {p.name for p in folder.iterdir() if (p / "kustomization.yaml").is_file()}


def test_generated_manifests_are_current():
    for name, text in generate.files().items():
        assert (DEPLOY / name).read_text() == text, "run: make docs"


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
    for folder in (DEPLOY / "base", DEPLOY / "base" / "exporter"):
        base = documents(folder / "kustomization.yaml")[0]
        assert set(base["resources"]) == listed_here(folder), folder
    for component in (DEPLOY / "components").iterdir():
        kustomization = documents(component / "kustomization.yaml")[0]
        assert kustomization["kind"] == "Component", component
        assert set(kustomization.get("resources", ())) == listed_here(component), component
    acting = documents(DEPLOY / "components" / "no-dry-run" / "kustomization.yaml")[0]
    assert "--no-dry-run" in acting["patches"][0]["patch"]
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


# not an API: the name the admission policies ask the authorizer about, each account its
# own (docs/remediator.md, "How the policies know numaguard's accounts")
IDENTITY = ("numaguard.io", "identities", "assume")


def granted(docs: list[dict], account: str) -> set[tuple[str, str, str]]:
    """What ``account`` may do, its identity aside (checked to be its own alone)."""
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("ClusterRole", "Role")}
    out = set()
    for d in docs:
        if d["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s["name"] == account for s in d["subjects"]):
            continue
        for rule in roles[d["roleRef"]["name"]]["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out |= {(group, resource, verb) for verb in rule["verbs"]}
            if (group, resource, *rule["verbs"]) == IDENTITY:
                assert d["kind"] == "ClusterRoleBinding", d  # a cluster-wide name
                assert rule["resourceNames"] == [account.removeprefix("numaguard-")], rule
    return out - {IDENTITY}


def test_rbac_grants_exactly_what_the_code_uses():
    """The base: the exporter's reads and a dry run's; the no-dry-run component adds the
    remediator's writes, and nothing else."""
    base, enforce = rendered(), rendered("no-dry-run")
    assert granted(base, "numaguard-exporter") == EXPORTER_API_USE
    assert granted(base, "numaguard-remediator") == DRY_RUN_API_USE
    assert granted(enforce, "numaguard-exporter") == EXPORTER_API_USE
    assert granted(enforce, "numaguard-remediator") == REMEDIATOR_API_USE
    assert REMEDIATOR_API_USE - DRY_RUN_API_USE == ENFORCE_API_USE
    # --nrt: the exporter publishes its NodeResourceTopology, with no other grant
    nrt = rendered("nrt")
    assert granted(nrt, "numaguard-exporter") == EXPORTER_API_USE | NRT_API_USE
    assert granted(nrt, "numaguard-remediator") == DRY_RUN_API_USE
    # --steer: its own webhook configuration and certificate Secret, by name
    steering = rendered("steering")
    assert granted(steering, "numaguard-remediator") == DRY_RUN_API_USE | STEERING_API_USE
    for kind, name in (("ClusterRole", "steering"), ("Role", "certificate")):
        for rule in of(steering, kind, f"numaguard-remediator-{name}")["rules"]:
            assert rule.get("resourceNames"), rule
    # the MIG manager mode's relabel: node patches and the MIG manager's ConfigMap by name
    mig = rendered("mig-layout")
    assert granted(mig, "numaguard-remediator") == DRY_RUN_API_USE | MIG_LAYOUT_API_USE
    (configmaps,) = [
        r
        for r in of(mig, "ClusterRole", "numaguard-remediator-mig-layout")["rules"]
        if "configmaps" in r["resources"]
    ]
    assert configmaps["resourceNames"] == ["default-mig-parted-config"]
    # seen: `secrets create` (no name can limit a create) let the remediator's token
    # mint a token Secret for any account of its namespace; the install makes the
    # certificate's Secret empty instead, and the leader fills it
    every = rendered(*COMPONENTS)
    for role in (d for d in every if d["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            if "secrets" in rule.get("resources", ()):
                assert "create" not in rule["verbs"] and rule.get("resourceNames"), role
    # the pages a person reads: a role to bind, reading those two paths and nothing else
    viewer = of(every, "ClusterRole", "numaguard-page-viewer")
    assert viewer["rules"] == [{"nonResourceURLs": ["/placement", "/decisions"], "verbs": ["get"]}]
    assert not [d for d in every if d.get("roleRef", {}).get("name") == "numaguard-page-viewer"]
    (secret,) = [d for d in every if d["kind"] == "Secret"]
    assert secret["type"] == "kubernetes.io/tls" and not any(secret["data"].values())
    remediator = of(steering, "Deployment", "numaguard-remediator")["spec"]["template"]["spec"]
    assert "--steer" in remediator["containers"][0]["args"]
    webhooks = of(steering, "MutatingWebhookConfiguration", "numaguard-remediator")
    assert webhooks["webhooks"] == []  # nothing is called until something is remediated
    exporter = of(nrt, "DaemonSet", "numaguard-exporter")["spec"]["template"]["spec"]
    assert "--nrt" in exporter["containers"][0]["args"]
    assert (
        "--nrt"
        not in of(base, "DaemonSet", "numaguard-exporter")["spec"]["template"]["spec"][
            "containers"
        ][0]["args"]
    )


COMPONENTS = (
    "no-dry-run",
    "resctrl-manage",
    "kubernetes-auth",
    "nrt",
    "network-policy",
    "steering",
    "memory-mover",
    "mig-layout",
    "kubelet-config",
)


@pytest.mark.parametrize("components", [(), *((c,) for c in COMPONENTS), COMPONENTS])
def test_the_base_with_any_components_renders_and_validates(components):
    docs = rendered(*components)
    assert {d["kind"] for d in docs} >= {"DaemonSet", "Deployment", "ServiceMonitor"}
    for doc in docs:
        if doc["kind"] not in CRDS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        # what the NetworkPolicy selects, and what `apply --prune -l` keeps track of
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "numaguard", doc


def test_components_combine_and_each_leaves_nothing_behind():
    """All at once, each does what it does alone: the flags of every one, and the
    objects of every one; without one, none of its objects or flags are left."""

    def args(docs, kind, name):
        return of(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]["args"]

    every = rendered(*COMPONENTS)
    exporter = args(every, "DaemonSet", "numaguard-exporter")
    remediator = args(every, "Deployment", "numaguard-remediator")
    assert {"--nrt", "--web.kubernetes-auth"} <= set(exporter)
    assert {"--no-dry-run", "--web.kubernetes-auth"} <= set(remediator)
    rdt = of(every, "DaemonSet", "numaguard-exporter-rdt")["spec"]["template"]["spec"]
    assert "resctrl" in {v["name"] for v in rdt["volumes"]}
    # the -rdt copy runs the same exporter, whatever order the components came in
    assert args(every, "DaemonSet", "numaguard-exporter-rdt") == exporter
    names = {(d["kind"], d["metadata"]["name"]) for d in every}
    base = {(d["kind"], d["metadata"]["name"]) for d in rendered()}
    for component in COMPONENTS:
        without = [c for c in COMPONENTS if c != component]
        docs = rendered(*without)
        added = names - {(d["kind"], d["metadata"]["name"]) for d in docs}
        own = {(d["kind"], d["metadata"]["name"]) for d in rendered(component)} - base
        assert added == own, component
    assert not {"--nrt", "--web.kubernetes-auth"} & set(
        args(rendered(), "DaemonSet", "numaguard-exporter")
    )
    assert "--no-dry-run" not in args(rendered(), "Deployment", "numaguard-remediator")


def of(docs: list[dict], kind: str, name: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_kube_prometheus_stack_selects_the_monitors_and_rules():
    """Selected by the release label kube-prometheus-stack's defaults select; how they
    are then scraped and evaluated, tests/test_operator.py shows with the real operator."""
    docs = rendered()
    for kind, name in (
        ("ServiceMonitor", "numaguard"),
        ("ServiceMonitor", "numaguard-remediator"),
        ("PrometheusRule", "numaguard"),
    ):
        assert of(docs, kind, name)["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    monitor = of(docs, "ServiceMonitor", "numaguard")["spec"]
    assert "jobLabel" not in monitor  # the job is set by relabeling, to what alerts expect


def test_the_exporter_mounts_only_what_it_reads_and_the_pods_are_confined():
    docs = rendered()
    spec = of(docs, "DaemonSet", "numaguard-exporter")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"]}
    assert volumes == {
        "sys": {"path": "/sys", "type": "Directory"},
        "proc": {"path": "/proc", "type": "Directory"},
        "pod-resources": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"},
    }
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    assert mounts == {"/host/sys": True, "/host/proc": True, "/var/lib/kubelet/pod-resources": True}
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    # what tests/test_privileges.py runs the exporter with: uid 0, no capability
    assert security["capabilities"] == {"drop": ["ALL"]} and security["runAsUser"] == 0
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    remediator = of(docs, "Deployment", "numaguard-remediator")["spec"]["template"]["spec"]
    assert remediator["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = remediator["containers"][0]["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    namespace = of(docs, "Namespace", "numaguard")["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "privileged"
    assert "NetworkPolicy" not in {d["kind"] for d in docs}  # opt-in: see the component
    policy = of(rendered("network-policy"), "NetworkPolicy", "numaguard-metrics")["spec"]
    assert [p["port"] for p in policy["ingress"][0]["ports"]] == [9847, 9848]
    # numaguard's pods only: others sharing the namespace are left alone
    assert policy["podSelector"] == {"matchLabels": {"app.kubernetes.io/part-of": "numaguard"}}


def test_the_mover_s_capability_sits_in_a_container_that_does_nothing_else():
    """components/memory-mover: the exporter keeps no capability; a container of its
    own holds CAP_SYS_PTRACE and nothing more, serves no port, mounts no kubelet socket,
    and shares a memory-backed folder with the exporter alone, where its socket is the
    one the exporter asks by default. In no rendering has any other container a
    capability."""
    for docs in (rendered("memory-mover"), rendered(*COMPONENTS)):
        spec = of(docs, "DaemonSet", "numaguard-exporter")["spec"]["template"]["spec"]
        exporter, helper = spec["containers"]
        assert exporter["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert helper["name"] == "memory-mover" and helper["image"] == exporter["image"]
        assert helper["command"] == ["numaguard-memory-mover"]
        security = helper["securityContext"]
        assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
        assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
        assert "ports" not in helper and "env" not in helper
        mounts = {m["mountPath"]: m.get("readOnly", False) for m in helper["volumeMounts"]}
        assert mounts == {"/host/sys": True, "/host/proc": True, "/run/numaguard": False}
        assert "/run/numaguard" in {m["mountPath"] for m in exporter["volumeMounts"]}
        (shared,) = [v for v in spec["volumes"] if v["name"] == "memory-mover"]
        assert shared["emptyDir"]["medium"] == "Memory"
        socket = f"--socket={Settings().memory_mover_socket}"
        assert socket in helper["args"] and "--memory-mover" in exporter["args"]
        held = {
            (doc["kind"], c["name"])
            for doc in docs
            if doc["kind"] in ("DaemonSet", "Deployment")
            for c in doc["spec"]["template"]["spec"]["containers"]
            if c.get("securityContext", {}).get("capabilities", {}).get("add")
        }
        assert held == {("DaemonSet", "memory-mover")}  # with resctrl-manage, in both


def test_resctrl_is_writable_only_with_its_component_and_only_where_it_exists():
    """A second DaemonSet, numaguard-exporter-rdt, on the nodes with RDT monitoring with
    resctrl writable; the first keeps every other node, read-only (a GPU node without
    RDT kept no exporter when the one DaemonSet moved to RDT nodes); the Service finds
    the pods of both, and the two DaemonSets never claim each other's."""
    docs = rendered("resctrl-manage")
    rdt_label = "feature.node.kubernetes.io/cpu-rdt.RDTMON"
    rdt = of(docs, "DaemonSet", "numaguard-exporter-rdt")["spec"]
    pod = rdt["template"]["spec"]
    assert {"name": "resctrl", "hostPath": {"path": "/sys/fs/resctrl", "type": "Directory"}} in (
        pod["volumes"]
    )
    mount = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "resctrl"]
    assert mount == [{"name": "resctrl", "mountPath": "/host/sys/fs/resctrl"}]
    assert pod["nodeSelector"][rdt_label] == "true"
    rest = of(docs, "DaemonSet", "numaguard-exporter")["spec"]
    assert "resctrl" not in {v["name"] for v in rest["template"]["spec"]["volumes"]}
    (term,) = rest["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term == {
        "matchExpressions": [{"key": rdt_label, "operator": "NotIn", "values": ["true"]}]
    }
    service = of(docs, "Service", "numaguard-exporter")["spec"]["selector"]
    for spec, other in ((rdt, rest), (rest, rdt)):
        labels = spec["template"]["metadata"]["labels"]
        assert service.items() <= labels.items()
        assert (
            not spec["selector"]["matchLabels"].items()
            <= other["template"]["metadata"]["labels"].items()
        )
    # without the component: one DaemonSet, read-only, on every GPU node
    (only,) = [d for d in rendered() if d["kind"] == "DaemonSet"]
    assert "affinity" not in only["spec"]["template"]["spec"]


def test_each_component_s_own_objects_carry_its_name_and_nothing_else_does():
    """What docs/install.md's `kubectl delete ... -l numaguard.io/component=<name>` removes
    when a component is taken out: its objects, and only those."""
    base = {(d["kind"], d["metadata"]["name"]) for d in rendered()}
    for component in COMPONENTS:
        for doc in rendered(component):
            key = (doc["kind"], doc["metadata"]["name"])
            label = doc["metadata"]["labels"].get("numaguard.io/component")
            assert label == (None if key in base else component), (component, key)


README = DEPLOY.parent / "README.md"


def readme_kustomization() -> str:
    text = README.read_text().split("**With kustomize**", 1)[1]
    return text.split("```yaml\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("uncommented", [False, True])
def test_the_readme_s_kustomization_renders_what_it_says(tmp_path, uncommented):
    """The README's kustomization, with this checkout where it says ../numaguard, as
    written (two components) and with every component it lists taken in."""
    text = readme_kustomization().replace("../numaguard/deploy", os.path.relpath(DEPLOY, tmp_path))
    if uncommented:
        text = text.replace("  # - ", "  - ")
    (tmp_path / "kustomization.yaml").write_text(text)
    docs = kustomized(tmp_path)
    exporter = of(docs, "DaemonSet", "numaguard-exporter")["spec"]["template"]["spec"]
    remediator = of(docs, "Deployment", "numaguard-remediator")["spec"]["template"]["spec"]
    container, *helper = exporter["containers"]  # and the memory mover's, when on
    assert container["image"] == "registry.example.com/numaguard-exporter:0.1.0"
    assert [c["image"] for c in helper] == [container["image"]] * uncommented
    assert remediator["containers"][0]["image"] == "registry.example.com/numaguard-remediator:0.1.0"
    assert "--nrt" in container["args"]
    rdt = of(docs, "DaemonSet", "numaguard-exporter-rdt")["spec"]["template"]["spec"]
    assert "resctrl" in {v["name"] for v in rdt["volumes"]}
    assert rdt["containers"][0]["args"] == container["args"]
    acting = "--no-dry-run" in remediator["containers"][0]["args"]
    assert acting == uncommented
    assert ("NetworkPolicy" in {d["kind"] for d in docs}) == uncommented
    assert ("--web.kubernetes-auth" in container["args"]) == uncommented

"""The Kubernetes objects a simulated cluster creates for a preset's pods: each pod
bound to its node, labelled for the ReplicaSet (and the paused Deployment above it)
that adopts it, with the requests its QoS class and allocation imply."""

from __future__ import annotations

import json

from numaguard.exporter.readers import parse_id_list
from numaguard.simulator.fakes.host import FakeContainer, FakePod

PRESET_HASH = "preset"  # the pod-template-hash of the ReplicaSets that adopt preset pods
MIN_MEMORY = 64 << 20


def stem(name: str) -> str:
    """The workload a preset pod belongs to: pods ``name`` and ``name.N`` are
    Deployment ``name``'s."""
    return name.split(".")[0]


def parse_quantity(text: str) -> int:
    """Bytes of a Kubernetes memory quantity as the API server writes them."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 1000, "M": 10**6}
    units |= {"G": 10**9}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    return int(text or 0)


def container_spec(pod: FakePod, ctr: FakeContainer) -> dict:
    """A container as the pod's QoS class and the preset's allocation imply it."""
    devices = {r: str(len(ids)) for r, ids in sorted(ctr.devices.items())}
    memory = str(max(sum(ctr.memory_by_node.values()), MIN_MEMORY))
    if pod.qos_class == "guaranteed":
        cpu = str(len(parse_id_list(ctr.cpus))) if ctr.exclusive_cpus else "500m"
        both = {"cpu": cpu, "memory": memory, **devices}
        resources = {"requests": both, "limits": both}
    elif pod.qos_class == "burstable":
        resources = {"requests": {"cpu": "100m", "memory": memory, **devices}}
        if devices:
            resources["limits"] = devices
    else:
        resources = {"requests": devices, "limits": devices} if devices else {}
    out = {"name": ctr.name, "image": f"registry.example/{ctr.name}:1.0", "resources": resources}
    claims = [{"name": claim.claim} for claim in ctr.claims]
    if claims:
        out["resources"]["claims"] = claims
    return out


def pod_template(pod: FakePod, workload: str, node: str | None = None) -> dict:
    spec = {
        "containers": [container_spec(pod, c) for c in pod.containers],
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 5,
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    claims = [c.claim for ctr in pod.containers for c in ctr.claims]
    if claims:
        spec["resourceClaims"] = [{"name": n, "resourceClaimName": n} for n in claims]
    return {"metadata": {"labels": {"app": workload}}, "spec": spec}


def bound_pod(pod: FakePod, node: str, template: dict) -> dict:
    """A preset pod, already bound to its node, labelled for its ReplicaSet to adopt."""
    labels = {**template["metadata"]["labels"], "pod-template-hash": PRESET_HASH}
    spec = json.loads(json.dumps(template["spec"]))
    spec["containers"] = [container_spec(pod, c) for c in pod.containers]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": labels},
        "spec": {**spec, "nodeName": node},
    }


def replicaset(namespace: str, name: str, template: dict, replicas: int) -> dict:
    labels = {**template["metadata"]["labels"], "pod-template-hash": PRESET_HASH}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": f"{name}-{PRESET_HASH}", "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {**template, "metadata": {"labels": labels}},
        },
    }


def deployment(namespace: str, name: str, template: dict, replicas: int) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "paused": True,
            "selector": {"matchLabels": template["metadata"]["labels"]},
            "template": template,
        },
    }

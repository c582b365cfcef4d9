"""Cluster state for the guards: the pods the findings name, with their controllers and
workloads, read from the API server (only those pods: the number of requests follows
the number of findings, not the size of the cluster)."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import replace
from datetime import datetime

from numaguard.contract.names import HISTORY_ANNOTATION, PENDING_LABEL, RELAYOUT_ANNOTATION
from numaguard.remediator.core.actions import DRA, PodInfo
from numaguard.remediator.core.claims import RESOURCE_API, ClaimRef, claim_profile
from numaguard.remediator.core.findings import Finding
from numaguard.remediator.core.guards import HISTORY_OWNERS
from numaguard.remediator.core.history import WorkloadHistory
from numaguard.remediator.core.miglayout import Entry, parse_configs
from numaguard.remediator.core.needs import Need
from numaguard.remediator.core.reach import NodeFacts, Placement
from numaguard.remediator.core.rejections import ADMISSION_REJECTIONS, RejectedPod
from numaguard.remediator.core.relayout import MigNode, Relayout
from numaguard.remediator.kube import Kube, parse_quantity

_CONCURRENCY = 16
_APPS = "/apis/apps/v1/namespaces"
_PAGE = 500  # failed pods a list answer holds
_NOT_ENDED = "status.phase!=Succeeded,status.phase!=Failed"


class ClusterError(Exception):
    """The API server did not answer as needed: no action this cycle."""


async def pods_of(kube: Kube, findings: list[Finding]) -> dict[str, PodInfo]:
    """UID -> PodInfo for the findings' pods that still exist (same UID), each with the
    history kept on its workload."""
    wanted = {(f.namespace, f.pod): f.pod_uid for f in findings if f.namespace and f.pod}
    for f in findings:  # a noisy neighbour is judged against the pod it crowds out
        if f.feeder_uid:
            namespace, _, name = f.feeder.partition("/")
            wanted[(namespace, name)] = f.feeder_uid
    owners: dict[str, dict | None] = {}

    async def one(namespace: str, name: str, uid: str) -> PodInfo | None:
        answer = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        if answer.status == 404:
            return None
        if not answer.ok:
            raise ClusterError(f"GET pod {namespace}/{name}: HTTP {answer.status}")
        pod = answer.body
        if pod.get("metadata", {}).get("uid") != uid:
            return None  # another pod of the same name since: not the one found
        return await _pod_info(kube, pod, owners)

    results = await _bounded(one, [(ns, n, uid) for (ns, n), uid in wanted.items()])
    if any(p is not None and p.extended_claim for p in results):
        mapped = await mapped_resources(kube)
        results = [_dra_mapped(p, mapped) if p and p.extended_claim else p for p in results]
    return {p.uid: p for p in results if p is not None}


def _dra_mapped(pod: PodInfo, mapped: frozenset[str]) -> PodInfo:
    """A pod whose extended resources DRA serves: those a DeviceClass maps are no node's
    allocatable (the scheduler makes a claim for them on a node without a device plugin
    offering them), so where its replacement may go is not judged by them."""
    placement = pod.placement
    if placement is not None:
        kept = {k: v for k, v in placement.requests.items() if k not in mapped}
        placement = replace(placement, requests=kept)
    return replace(pod, mapped=mapped, placement=placement)


async def mapped_resources(kube: Kube) -> frozenset[str]:
    """The extended resources DeviceClasses map (extendedResourceName): those a pod's
    containers may ask for that the scheduler turns into a ResourceClaim."""
    answer = await kube.get(f"{RESOURCE_API}/deviceclasses")
    if not answer.ok:
        raise ClusterError(f"LIST deviceclasses: HTTP {answer.status}")
    return frozenset(
        name
        for c in answer.body.get("items") or []
        if (name := (c.get("spec") or {}).get("extendedResourceName"))
    )


async def _bounded(call, args: list[tuple]) -> list:
    """``call(*a)`` for each of ``args``, at most _CONCURRENCY at a time, in order."""
    limit = asyncio.Semaphore(_CONCURRENCY)

    async def one(a: tuple):
        async with limit:
            return await call(*a)

    return await asyncio.gather(*(one(a) for a in args))


async def _pod_info(kube: Kube, pod: dict, owners: dict[str, dict | None]) -> PodInfo:
    meta, spec = pod["metadata"], pod.get("spec", {})
    namespace = meta["namespace"]
    owner = _controller(meta)
    workload, workload_annotations, mismatch, history = "", {}, "", None
    placement, selector = None, {}
    if owner is not None:
        workload, top, mismatch, maker = await _workload(kube, namespace, owner, owners)
        made_by = (maker or {}).get("spec") or {}
        template = (made_by.get("template") or {}).get("spec")
        by = made_by.get("selector") or {}
        if not by.get("matchExpressions"):
            selector = dict(by.get("matchLabels") or {})
        if template is not None:
            try:  # where a replacement may run is its template's to say, not this pod's
                placement = placement_of(template)
            except ValueError as err:
                mismatch = mismatch or f"{workload}: {err}"
        workload_annotations = ((top or {}).get("metadata") or {}).get("annotations") or {}
        text = workload_annotations.get(HISTORY_ANNOTATION)
        if text and not mismatch:
            try:
                history = WorkloadHistory.from_json(text)
            except ValueError as err:  # never act as if nothing had been done before
                mismatch = f"{workload}: {HISTORY_ANNOTATION}: {err}"
    annotations = meta.get("annotations") or {}
    volumes = spec.get("volumes") or []
    return PodInfo(
        namespace=namespace,
        name=meta["name"],
        uid=meta["uid"],
        node=spec.get("nodeName", ""),
        created=_timestamp(meta.get("creationTimestamp")),
        owner_kind=owner["kind"] if owner else "",
        owner_name=owner["name"] if owner else "",
        workload=workload,
        workload_annotations=dict(workload_annotations),
        annotations=dict(annotations),
        priority=int(spec.get("priority") or 0),
        priority_class=spec.get("priorityClassName", ""),
        local_storage=any("emptyDir" in v or "hostPath" in v for v in volumes),
        mirror="kubernetes.io/config.mirror" in annotations,
        phase=(pod.get("status") or {}).get("phase", ""),
        mismatch=mismatch,
        history=history,
        resources=_extended_resources(spec),
        placement=placement,
        requests=requests_of(spec),
        selector=selector,
        claims=await _claims(kube, namespace, spec),
        extended_claim=((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get(
            "resourceClaimName", ""
        ),
    )


async def _claims(kube: Kube, namespace: str, spec: dict) -> tuple[ClaimRef, ...]:
    """The pod's ResourceClaims, each with the MIG profile its spec selects by name
    ("" when it selects none, or cannot be read)."""
    refs = []
    for entry in spec.get("resourceClaims") or ():
        template = entry.get("resourceClaimTemplateName") or ""
        claim = entry.get("resourceClaimName") or ""
        kind, name = ("resourceclaimtemplates", template) if template else ("resourceclaims", claim)
        profile = ""
        if name:
            answer = await kube.get(f"{RESOURCE_API}/namespaces/{namespace}/{kind}/{name}")
            if answer.ok:
                claim_spec = answer.body.get("spec") or {}
                if template:  # a template's spec holds the claims' spec
                    claim_spec = claim_spec.get("spec") or {}
                profile = claim_profile(claim_spec)
        refs.append(ClaimRef(entry.get("name", ""), template, claim, profile))
    return tuple(refs)


async def _workload(
    kube: Kube, namespace: str, ref: dict, owners: dict[str, dict | None]
) -> tuple[str, dict | None, str, dict | None]:
    """(kind/namespace/name of the top owner, its object, mismatch, the controller that
    makes the pod's replacements): owner references are followed by uid, so a
    same-named object made since is not taken for the owner."""
    kind, name = ref["kind"], ref["name"]
    if kind not in ("ReplicaSet", "StatefulSet"):
        return f"{kind}/{namespace}/{name}", None, "", None  # not followed: never acted on
    obj, why = await _owner(kube, namespace, ref, owners)
    if why:
        return f"{kind}/{namespace}/{name}", None, why, None
    parent = _controller(obj["metadata"]) if kind == "ReplicaSet" else None
    if parent is None:
        return f"{kind}/{namespace}/{name}", obj, "", obj
    if parent["kind"] != "Deployment":
        return f"{parent['kind']}/{namespace}/{parent['name']}", None, "", obj
    top, why = await _owner(kube, namespace, parent, owners)
    return f"Deployment/{namespace}/{parent['name']}", top, why, obj


async def _owner(
    kube: Kube, namespace: str, ref: dict, owners: dict[str, dict | None]
) -> tuple[dict | None, str]:
    path = f"{_APPS}/{namespace}/{HISTORY_OWNERS[ref['kind']]}/{ref['name']}"
    if path not in owners:
        answer = await kube.get(path)
        if not answer.ok and answer.status != 404:
            raise ClusterError(f"GET {path}: HTTP {answer.status}")
        owners[path] = answer.body if answer.ok else None
    obj = owners[path]
    if obj is None:
        return None, f"its owner {ref['kind']} {ref['name']} does not exist"
    if obj.get("metadata", {}).get("uid") != ref.get("uid"):
        return None, f"its owner reference's uid is not {ref['kind']} {ref['name']}'s"
    return obj, ""


async def pending_workloads(kube: Kube) -> dict[str, tuple[WorkloadHistory | None, dict]]:
    """Workloads with actions awaiting verification (labelled so by the actuator): by
    workload, their history (None when unreadable) and object."""
    out: dict[str, tuple[WorkloadHistory | None, dict]] = {}
    for kind, resource in HISTORY_OWNERS.items():
        answer = await kube.get(f"/apis/apps/v1/{resource}", labelSelector=f"{PENDING_LABEL}=true")
        if not answer.ok:
            raise ClusterError(f"LIST {resource}: HTTP {answer.status}")
        for obj in answer.body.get("items") or []:
            meta = obj["metadata"]
            try:
                history = WorkloadHistory.from_json(meta.get("annotations", {})[HISTORY_ANNOTATION])
            except (KeyError, ValueError):
                history = None
            out[f"{kind}/{meta['namespace']}/{meta['name']}"] = (history, obj)
    return out


async def workload_pods(kube: Kube, workload: str, obj: dict) -> list[PodInfo] | None:
    """The workload's pods now (by its selector, then owner uids); None when its
    selector cannot be read as labels."""
    namespace = workload.split("/")[1]
    selector = (obj.get("spec") or {}).get("selector") or {}
    labels = selector.get("matchLabels") or {}
    if not labels or selector.get("matchExpressions"):
        return None
    answer = await kube.get(
        f"/api/v1/namespaces/{namespace}/pods",
        labelSelector=",".join(f"{k}={v}" for k, v in sorted(labels.items())),
    )
    if not answer.ok:
        raise ClusterError(f"LIST pods of {workload}: HTTP {answer.status}")
    owners: dict[str, dict | None] = {}
    infos = [await _pod_info(kube, p, owners) for p in answer.body.get("items") or []]
    return [p for p in infos if p.workload == workload and not p.mismatch]


async def rejected_pods(kube: Kube) -> list[RejectedPod]:
    """Every pod the kubelet refused for alignment (Failed, for one of
    ADMISSION_REJECTIONS), cluster-wide: one paged list of the failed pods."""
    out: list[RejectedPod] = []
    owners: dict[str, dict | None] = {}
    token = ""
    while True:
        query = {"fieldSelector": "status.phase=Failed", "limit": str(_PAGE)}
        if token:
            query["continue"] = token
        answer = await kube.get("/api/v1/pods", **query)
        if not answer.ok:
            raise ClusterError(f"LIST failed pods: HTTP {answer.status}")
        for pod in answer.body.get("items") or []:
            reason = (pod.get("status") or {}).get("reason")
            if reason in ADMISSION_REJECTIONS:
                out.append(await _rejected(kube, pod, reason, owners))
        token = (answer.body.get("metadata") or {}).get("continue") or ""
        if not token:
            return out


async def _rejected(kube: Kube, pod: dict, reason: str, owners: dict) -> RejectedPod:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    owner = _controller(meta)
    workload, owned = "", False
    if owner is not None:
        workload, obj, mismatch, _ = await _workload(kube, meta["namespace"], owner, owners)
        if mismatch:
            workload = ""  # owned by something it cannot be shown to belong to: bare
        owned = not mismatch and obj is not None  # a workload that exists, by uid
    return RejectedPod(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta["uid"],
        node=spec.get("nodeName", ""),
        reason=reason,
        created=_timestamp(meta.get("creationTimestamp")),
        workload=workload,
        need=_need(spec),
        annotations=dict(meta.get("annotations") or {}),
        owned=owned,
        message=str((pod.get("status") or {}).get("message") or ""),
    )


def _need(spec: dict) -> Need:
    """What a pod asks to have on one NUMA node: its exclusive CPUs (a Guaranteed pod's
    whole CPUs, as the CPU manager gives them), its memory and its devices."""
    cpus = memory = 0.0
    devices: dict[str, int] = {}
    guaranteed = True
    for c in spec.get("containers") or []:
        resources = c.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = {**limits, **(resources.get("requests") or {})}  # unset: the limit
        for name in ("cpu", "memory"):
            if name not in limits or parse_quantity(requests.get(name, 0)) != parse_quantity(
                limits[name]
            ):
                guaranteed = False
        cpus += float(parse_quantity(requests.get("cpu", 0)))
        memory += float(parse_quantity(requests.get("memory", 0)))
        for name, value in requests.items():
            if _is_device(name):
                devices[name] = devices.get(name, 0) + int(parse_quantity(value))
    exclusive = cpus if guaranteed and cpus == int(cpus) else 0.0
    return Need(exclusive, memory, devices)


def _extended_resources(spec: dict) -> frozenset[str]:
    """The devices a pod asks for: extended resources (a domain of their own, not
    kubernetes.io's) in its containers' requests or limits, and DRA claims."""
    names = {
        name
        for c in spec.get("containers") or []
        for part in ("requests", "limits")
        for name in ((c.get("resources") or {}).get(part) or {})
        if _is_device(name)
    }
    if spec.get("resourceClaims"):
        names.add(DRA)
    return frozenset(names)


def _is_device(resource: str) -> bool:
    """An extended resource: a domain of its own, not kubernetes.io's."""
    return "/" in resource and not resource.split("/")[0].endswith("kubernetes.io")


def _controller(meta: dict) -> dict | None:
    return next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)


def _timestamp(text: str | None) -> float:
    if not text:
        return math.inf  # unknown age counts as brand new: too young to touch
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def requests_of(spec: dict) -> dict[str, float]:
    """The pod's whole requests, as the scheduler counts them: its containers' sum (a
    request left unset is its limit), or an init container's if larger (sidecars, which
    keep running, add to both), plus the pod's overhead; and one of the node's pods."""

    def of(c: dict) -> Counter:
        resources = c.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return Counter({k: float(parse_quantity(v)) for k, v in merged.items()})

    total: Counter = Counter()
    sidecars: Counter = Counter()
    init_peak: Counter = Counter()
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            sidecars.update(of(c))
        else:
            for k, v in (of(c) + sidecars).items():
                init_peak[k] = max(init_peak[k], v)
    for c in spec.get("containers") or []:
        total.update(of(c))
    total.update(sidecars)
    for k, v in init_peak.items():
        total[k] = max(total[k], v)
    total.update({k: float(parse_quantity(v)) for k, v in (spec.get("overhead") or {}).items()})
    total["pods"] = 1
    return {k: v for k, v in total.items() if v}


def placement_of(spec: dict) -> Placement:
    """Where a pod of this spec (a template's) may be scheduled; ValueError on a spec no
    API server would store."""
    try:
        affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
        required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        return Placement(
            dict(spec.get("nodeSelector") or {}),
            tuple(required.get("nodeSelectorTerms") or ()) if required else None,
            tuple(spec.get("tolerations") or ()),
            requests_of(spec),
        )
    except (AttributeError, TypeError, ValueError) as err:
        raise ValueError(f"unreadable pod template: {err}") from None


def node_facts(node: dict, pods: list[dict]) -> NodeFacts:
    """A Node, with the pods bound to it that have not ended."""
    meta, spec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    requested: Counter = Counter()
    for pod in pods:
        requested.update(requests_of(pod.get("spec") or {}))
    return NodeFacts(
        meta["name"],
        dict(meta.get("labels") or {}),
        tuple(spec.get("taints") or ()),
        bool(spec.get("unschedulable")),
        conditions.get("Ready") == "True",
        {k: float(parse_quantity(v)) for k, v in (status.get("allocatable") or {}).items()},
        dict(requested),
    )


async def nodes_of(kube: Kube, names: list[str]) -> dict[str, NodeFacts]:
    """The named nodes that exist, each with what its pods request (one GET and one
    list of its pods per node: the requests follow the findings, not the cluster)."""

    async def one(name: str) -> NodeFacts | None:
        answer = await kube.get(f"/api/v1/nodes/{name}")
        if answer.status == 404:
            return None
        if not answer.ok:
            raise ClusterError(f"GET node {name}: HTTP {answer.status}")
        pods = await kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={name},{_NOT_ENDED}")
        if not pods.ok:
            raise ClusterError(f"LIST pods on {name}: HTTP {pods.status}")
        return node_facts(answer.body, pods.body.get("items") or [])

    found = await _bounded(one, [(n,) for n in names])
    return {f.name: f for f in found if f is not None}


async def mig_nodes(kube: Kube, selector: str, metadata_only: bool = False) -> list[MigNode]:
    """The nodes of ``selector`` (the MIG manager's, opted in to re-layout), their pods
    not read yet; ``metadata_only``: their labels and annotations alone (a tenth of the
    bytes: enough for their GPUs and re-layouts, none taken as unschedulable)."""
    if metadata_only:
        answer = await kube.list_metadata("/api/v1/nodes", labelSelector=selector)
    else:
        answer = await kube.get("/api/v1/nodes", labelSelector=selector)
    if not answer.ok:
        raise ClusterError(f"LIST nodes {selector}: HTTP {answer.status}")
    out = []
    for node in answer.body.get("items") or []:
        meta = node.get("metadata") or {}
        relayout, doubt = None, ""
        if RELAYOUT_ANNOTATION in (meta.get("annotations") or {}):
            try:
                relayout = Relayout.decode(meta["annotations"][RELAYOUT_ANNOTATION])
            except ValueError as err:
                doubt = str(err)
        unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
        labels = meta.get("labels") or {}
        version = meta.get("resourceVersion", "")
        name = meta.get("name", "")
        out.append(MigNode(name, labels, unschedulable, relayout, doubt, version=version))
    return out


async def gpu_pods(kube: Kube, node: str) -> tuple[str, ...]:
    """The pods on ``node`` not ended that hold or ask for a GPU: an nvidia.com/
    resource in any container, or a ResourceClaim (whatever its device: counted)."""
    answer = await kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node},{_NOT_ENDED}")
    if not answer.ok:
        raise ClusterError(f"LIST pods on {node}: HTTP {answer.status}")
    out = []
    for pod in answer.body.get("items") or []:
        spec = pod.get("spec") or {}
        containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
        asked = {
            name
            for c in containers
            for part in ("requests", "limits")
            for name in ((c.get("resources") or {}).get(part) or {})
        }
        if spec.get("resourceClaims") or any(n.startswith("nvidia.com/") for n in asked):
            meta = pod.get("metadata") or {}
            out.append(f"{meta.get('namespace')}/{meta.get('name')}")
    return tuple(out)


async def mig_configs(kube: Kube, config_map: str, key: str) -> dict[str, tuple[Entry, ...]]:
    """The MIG manager's configs, from its ConfigMap; ClusterError when it cannot be
    read or is not a mig-parted config."""
    namespace, name = config_map.split("/")
    answer = await kube.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    if not answer.ok:
        raise ClusterError(f"GET configmap {config_map}: HTTP {answer.status}")
    text = (answer.body.get("data") or {}).get(key)
    if text is None:
        raise ClusterError(f"configmap {config_map} has no {key}")
    try:
        return parse_configs(text)
    except ValueError as err:
        raise ClusterError(f"configmap {config_map} {key}: {err}") from None

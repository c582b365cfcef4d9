"""Cluster state for the guards: the pods the findings name, with their controllers and
workloads, read from the API server (only those pods: the number of requests follows
the number of findings, not the size of the cluster)."""

from __future__ import annotations

import asyncio
import math
from datetime import datetime

from remediator.findings import Finding
from remediator.kube import Kube
from remediator.planner import PodInfo

_CONCURRENCY = 16
_APPS = "/apis/apps/v1/namespaces"


class ClusterError(Exception):
    """The API server did not answer as needed: no action this cycle."""


async def pods_of(kube: Kube, findings: list[Finding]) -> dict[str, PodInfo]:
    """UID -> PodInfo for the findings' pods that still exist (same UID)."""
    wanted = {(f.namespace, f.pod): f.pod_uid for f in findings if f.namespace and f.pod}
    for f in findings:  # a noisy neighbour is judged against the pod it crowds out
        if f.feeder_uid:
            namespace, _, name = f.feeder.partition("/")
            wanted[(namespace, name)] = f.feeder_uid
    owners: dict[str, dict | None] = {}
    limit = asyncio.Semaphore(_CONCURRENCY)

    async def one(namespace: str, name: str, uid: str) -> PodInfo | None:
        async with limit:
            answer = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            if answer.status == 404:
                return None
            if not answer.ok:
                raise ClusterError(f"GET pod {namespace}/{name}: HTTP {answer.status}")
            pod = answer.body
            if pod.get("metadata", {}).get("uid") != uid:
                return None  # another pod of the same name since: not the one found
            return await _pod_info(kube, pod, owners)

    results = await asyncio.gather(*(one(ns, n, uid) for (ns, n), uid in wanted.items()))
    return {p.uid: p for p in results if p is not None}


async def _pod_info(kube: Kube, pod: dict, owners: dict[str, dict | None]) -> PodInfo:
    meta, spec = pod["metadata"], pod.get("spec", {})
    namespace = meta["namespace"]
    owner = _controller(meta)
    workload, workload_annotations = "", {}
    if owner is not None:
        kind, name = owner["kind"], owner["name"]
        top_kind, top_name, top = kind, name, None
        if kind == "ReplicaSet":
            rs = await _get_owner(kube, f"{_APPS}/{namespace}/replicasets/{name}", owners)
            parent = _controller(rs["metadata"]) if rs else None
            if parent is not None and parent["kind"] == "Deployment":
                top_kind, top_name = "Deployment", parent["name"]
                top = await _get_owner(kube, f"{_APPS}/{namespace}/deployments/{top_name}", owners)
            else:
                top = rs
        elif kind == "StatefulSet":
            top = await _get_owner(kube, f"{_APPS}/{namespace}/statefulsets/{name}", owners)
        workload = f"{top_kind}/{namespace}/{top_name}"
        workload_annotations = ((top or {}).get("metadata") or {}).get("annotations") or {}
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
    )


async def _get_owner(kube: Kube, path: str, owners: dict[str, dict | None]) -> dict | None:
    if path not in owners:
        answer = await kube.get(path)
        if not answer.ok and answer.status != 404:
            raise ClusterError(f"GET {path}: HTTP {answer.status}")
        owners[path] = answer.body if answer.ok else None
    return owners[path]


def _controller(meta: dict) -> dict | None:
    return next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)


def _timestamp(text: str | None) -> float:
    if not text:
        return math.inf  # unknown age counts as brand new: too young to touch
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

"""Prometheus's answers as the remediator's planner sees them: rows of healthy nodes,
findings, zones, and a plan run over them."""

from __future__ import annotations

from numaguard.remediator.core.actions import PodInfo
from numaguard.remediator.core.answers import Signals
from numaguard.remediator.core.findings import FindingState, update
from numaguard.remediator.core.needs import Need
from numaguard.remediator.core.planner import plan
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import REQUIRED_LABELS
from numaguard.remediator.core.reach import Placement
from numaguard.remediator.core.rejections import RejectedPod
from numaguard.simulator.cluster.fleet import open_nodes
from numaguard.simulator.parts.prometheus import as_signals

GIB = 1 << 30


NOW = 1_800_000_000.0


COLLECTORS = ("host_numa", "pod_placement", "gpu", "pod_resources", "resctrl")


def instance(node: str) -> str:
    return f"{node}.exporter:9847"


def signals(**frames: list[dict]) -> Signals:
    """Signals with the given rows per query, read as real answers are; each row gets
    its node's exporter as ``instance`` unless it names one."""
    for name in frames:
        assert name in REQUIRED_LABELS, name
    nodes = {r["node"] for rows in frames.values() for r in rows if "node" in r}
    return as_signals(NOW, frames, {n: instance(n) for n in nodes})


def healthy(*nodes: str) -> dict:
    """Each node's exporter target is up and all its collectors just succeeded."""
    rows = [{"node": n, "collector": c} for n in nodes for c in COLLECTORS]
    return {
        "targets_up": [{"node": n, "version": "0.1.0", "value": 1.0} for n in nodes],
        "collector_age": [{**r, "value": 5.0} for r in rows],
        "collector_success": [{**r, "value": 1.0} for r in rows],
    }


def zone(node: str, numa: str, cpus: float, memory_gib: float, devices=None) -> dict:
    return {
        "zone_free_cpus": [{"node": node, "numa_node": numa, "value": cpus}],
        "zone_free_memory": [{"node": node, "numa_node": numa, "value": memory_gib * GIB}],
        "zone_free_devices": [
            {"node": node, "numa_node": numa, "resource": r, "value": v}
            for r, v in (devices or {}).items()
        ],
    }


def merge(*parts: dict) -> dict:
    out: dict[str, list] = {}
    for part in parts:
        for k, v in part.items():
            out.setdefault(k, []).extend(v)
    return out


def cross_numa(pod: str, node: str = "n1", reason: str = "device_remote", age=1.0) -> dict:
    return _verdict("cross_numa", pod, reason, node, age)


def needs(
    pod: str, cpus: float, memory_gib: float, gpu: str = "nvidia.com/gpu", node: str = "n1"
) -> dict:
    """What the pod holds: CPUs and memory on NUMA node 0 of its node, and a GPU the
    kubelet gave it on NUMA node 1 (device_remote)."""
    ids = {"node": node, "namespace": "ml", "pod": pod, "pod_uid": f"uid-{pod}", "numa_node": "0"}
    return {
        "pod_exclusive_cpus": [{**ids, "value": cpus}],
        "pod_memory": [{**ids, "value": memory_gib * GIB}],
        "holders": [
            {
                **ids,
                "numa_node": "1",
                "gpu": "0",
                "gpu_uuid": f"GPU-{pod}",
                "resource": gpu,
                "source": "kubelet",
                "value": 1.0,
            }
        ],
    }


def pod_info(name: str, **kw) -> PodInfo:
    defaults = dict(
        namespace="ml",
        name=name,
        uid=f"uid-{name}",
        node="n1",
        created=NOW - 3600,
        owner_kind="ReplicaSet",
        owner_name=f"{name}-rs",
        workload=f"Deployment/ml/{name}",
        resources=frozenset({"nvidia.com/gpu"}),
        placement=Placement(),
    )
    return PodInfo(**{**defaults, **kw})


def run(sig: Signals, pods: list[PodInfo], policy=None, history=None):
    policy = policy or Policy(dry_run=False)
    findings = list(update(FindingState(), sig).open.values())
    return plan(
        findings, {p.uid: p for p in pods}, sig, policy, history or {}, NOW, open_nodes(sig)
    )


def starved_row(pod: str, reason: str, gpu_uuid: str = "") -> dict:
    row = {
        "node": "n1",
        "namespace": "ml",
        "pod": pod,
        "pod_uid": f"uid-{pod}",
        "reason": reason,
        "gpu": "0",
        "gpu_uuid": gpu_uuid or f"GPU-{pod}",
        "mig_uuid": "",
        "value": 1.0,
    }
    return {
        "starved_sustained": [row],
        "starved_seen": [row],
        "starved_age": [{**row, "value": 1.0}],
    }


def link_poor(pod: str, reason: str = "no_p2p", node: str = "n1") -> dict:
    """A gpu_link finding's rows: the pod's GPUs cannot reach each other peer to peer."""
    return _verdict("gpu_link", pod, reason, node)


def breaks_pair(pod: str, node: str = "n1") -> dict:
    """A gpu_fragmentation finding's rows: the pod holds half of the last joined pair."""
    return _verdict("gpu_fragmentation", pod, "breaks_pair", node)


def _verdict(kind: str, pod: str, reason: str, node: str, age: float = 1.0) -> dict:
    """A verdict's rows as the kind's sustained, seen and age queries answer them."""
    row = {
        "node": node,
        "namespace": "ml",
        "pod": pod,
        "pod_uid": f"uid-{pod}",
        "reason": reason,
        "value": 1.0,
    }
    return {
        f"{kind}_sustained": [row],
        f"{kind}_seen": [row],
        f"{kind}_age": [{**row, "value": age}],
    }


def gpus_held(pod: str, gpus: int, cpus: float, memory_gib: float, node: str = "n1") -> dict:
    """What a multi-GPU pod holds: CPUs and memory on NUMA node 0, ``gpus`` full GPUs the
    kubelet gave it, one on each NUMA node in turn (so joined at SYS)."""
    ids = {"node": node, "namespace": "ml", "pod": pod, "pod_uid": f"uid-{pod}", "numa_node": "0"}
    return {
        "pod_exclusive_cpus": [{**ids, "value": cpus}],
        "pod_memory": [{**ids, "value": memory_gib * GIB}],
        "holders": [
            {
                **ids,
                "numa_node": str(i % 2),
                "gpu": str(i),
                "gpu_uuid": f"GPU-{pod}-{i}",
                "resource": "nvidia.com/gpu",
                "source": "kubelet",
                "value": 1.0,
            }
            for i in range(gpus)
        ],
    }


def free_set(node: str, numa: str, size: int, level: str) -> dict:
    """The best level a free set of ``size`` GPUs reaches on the NUMA node."""
    row = {"node": node, "numa_node": numa, "size": str(size), "level": level, "value": 1.0}
    return {"zone_gpu_free_sets": [row]}


def rejected(name: str, workload: str = "Deployment/ml/trainer", node="n1", age=0.0, **kw):
    return RejectedPod(
        namespace=kw.pop("namespace", "ml"),
        name=name,
        uid=f"uid-{name}",
        node=node,
        reason=kw.pop("reason", "TopologyAffinityError"),
        created=NOW - age,
        workload=workload,
        need=Need(8.0, 32 * GIB, {"nvidia.com/gpu": 1}),
        owned=kw.pop("owned", bool(workload)),
        **kw,
    )

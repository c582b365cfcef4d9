"""A node's placement map (pure): its sockets, NUMA nodes (with their distances), L3
caches, CPUs, memory and GPUs with their MIG slices, which pod holds each, and each pod's
verdicts in words — what the exporter's ``/placement`` page draws, and serves as JSON.

Only what the cycle's snapshot knows is said: when the pods' cgroups were not read, no
CPU's holder is known (``pods_known`` false), never "all in the shared pool"; a NUMA
node whose memory was not read has none; a pod is listed when it holds exclusive CPUs
or devices or has a verdict (the rest share the pool, their memory summed as others').
"""

from __future__ import annotations

from numaguard.contract.reasons import L3_SPAN, SMT_SHARED
from numaguard.exporter.model import NodeSnapshot
from numaguard.exporter.model.placement import PodState

# a verdict's reason in words, by its kind: what the page says of an outlined pod
WORDS = {
    "cross_numa": {
        "cpu_span": "exclusive CPUs on several NUMA nodes",
        "memory_remote": "memory away from its CPUs' NUMA node",
        "device_remote": "a device on another NUMA node than its CPUs",
    },
    "core_isolation": {
        SMT_SHARED: "exclusive CPUs sharing a core with a thread not its own",
        L3_SPAN: "exclusive CPUs over more L3 caches than they need",
    },
    "gpu_link": {
        "no_p2p": "GPUs that cannot reach each other peer to peer",
        "split_containers": "GPUs split across containers",
        "mig_slices": "MIG slices, which do no P2P",
    },
}
STARVED = "starved"


def words(kind: str, reason: str) -> str:
    if kind == STARVED:
        return f"a starved GPU: {reason.replace('_', ' ')}"
    return WORDS.get(kind, {}).get(reason, reason.replace("_", " "))


def placement_map(snap: NodeSnapshot, pods_known: bool = True) -> dict:
    """The map as plain data (the JSON the page serves); ``pods_known``: whether this
    cycle read the pods' cgroups."""
    topology = snap.topology
    socket_of = topology.socket_of_cpu if topology else {}
    listed = _listed(snap)
    holder = {
        cpu: pod.uid
        for pod in snap.pods
        for ctr in pod.containers
        if ctr.exclusive_cpus and ctr.cpus
        for cpu in ctr.cpus
    }
    config = snap.kubelet_config
    reserved = config.cpu_manager.reserved if config and config.cpu_manager.reserved else set()
    core_of = topology.core_of_cpu if topology else {}
    numa_nodes = []
    for node in snap.numa_nodes:
        cpus = sorted(node.cpus or ())
        sockets = {socket_of[c] for c in cpus if c in socket_of}
        memory = _memory(node, snap.pods, listed)
        caches = (
            [
                {"id": d.id, "cpus": sorted(d.cpus & set(cpus))}
                for d in sorted(topology.l3_domains.values(), key=lambda d: d.id)
                if d.cpus & set(cpus)
            ]
            if topology
            else []
        )
        distances = topology.distance.get(node.id, {}) if topology else {}
        numa_nodes.append(
            {
                "numa_node": node.id,
                "socket": min(sockets) if len(sockets) == 1 else None,
                "distances": {str(n): d for n, d in sorted(distances.items())},
                **memory,
                "l3_caches": caches,
                "cpus": [
                    {
                        "cpu": c,
                        "core": min(core_of[c]) if c in core_of else None,
                        "holder": holder.get(c, ""),
                        "reserved": c in reserved,
                    }
                    for c in cpus
                ],
                "gpus": [],
            }
        )
    by_id = {n["numa_node"]: n for n in numa_nodes}
    unplaced = []
    held = {(use.mig or use.gpu).uuid: use.pod_uid for use in snap.device_uses}
    for gpu in snap.gpus.gpus if snap.gpus else ():
        entry = _gpu(gpu, held)
        (by_id[gpu.numa_node]["gpus"] if gpu.numa_node in by_id else unplaced).append(entry)
    sockets: dict[int, list[int]] = {}
    for n in numa_nodes:
        if n["socket"] is not None:
            sockets.setdefault(n["socket"], []).append(n["numa_node"])
    return {
        "node": snap.node_name,
        "time": snap.timestamp,
        "pods_known": pods_known,
        "sockets": [{"socket": s, "numa_nodes": ids} for s, ids in sorted(sockets.items())],
        "numa_nodes": numa_nodes,
        "gpus_on_no_numa_node": unplaced,
        "pods": {uid: _pod(snap, pod) for uid, pod in listed.items()},
    }


def _listed(snap: NodeSnapshot) -> dict[str, PodState]:
    """The pods worth a colour: exclusive CPUs, devices, or a verdict."""
    holding = {use.pod_uid for use in snap.device_uses}
    return {
        p.uid: p
        for p in snap.pods
        if p.exclusive_cpus_by_node or p.uid in holding or _verdicts(snap, p)
    }


def _memory(node, pods, listed) -> dict:
    if node.meminfo is None:
        return {}
    by_pod, other = {}, 0
    for pod in pods:
        size = (pod.memory_by_node or {}).get(node.id, 0)
        if pod.uid in listed:
            if size:
                by_pod[pod.uid] = size
        else:
            other += size
    return {
        "memory_total_bytes": node.meminfo.total_bytes,
        "memory_free_bytes": node.meminfo.free_bytes,
        "memory_by_pod": by_pod,
        "memory_other_pods_bytes": other,
    }


def _gpu(gpu, held: dict[str, str]) -> dict:
    """A GPU, its holder and its slices by placement (device uuid -> holder: ``held``)."""
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "model": gpu.name,
        "holder": held.get(gpu.uuid, ""),
        "mig": bool(gpu.mig_enabled),
        "slices": [
            {
                "uuid": s.uuid,
                "profile": s.profile,
                "start": s.placement_start,
                "size": s.placement_size,
                "holder": held.get(s.uuid, ""),
            }
            for s in gpu.slices
        ],
    }


def _pod(snap: NodeSnapshot, pod: PodState) -> dict:
    devices = sorted({(u.mig or u.gpu).uuid for u in snap.device_uses if u.pod_uid == pod.uid})
    cpus = sorted(c for ctr in pod.containers if ctr.exclusive_cpus for c in ctr.cpus or ())
    return {
        "namespace": pod.namespace,
        "name": pod.name,
        "exclusive_cpus": cpus,
        "cpus_by_numa_node": {str(n): k for n, k in (pod.exclusive_cpus_by_node or {}).items()},
        "memory_by_numa_node": {str(n): b for n, b in (pod.memory_by_node or {}).items()},
        "devices": devices,
        "verdicts": [
            {"kind": kind, "reason": reason, "words": words(kind, reason)}
            for kind, reason in _verdicts(snap, pod)
        ],
    }


def _verdicts(snap: NodeSnapshot, pod: PodState) -> list[tuple[str, str]]:
    """(kind, reason) of every verdict that holds for the pod this cycle."""
    out = [("cross_numa", r) for r, v in pod.cross_numa.items() if v]
    if pod.isolation is not None:
        out += [("core_isolation", r) for r, v in pod.isolation.verdicts.items() if v]
    for s in snap.starvation:
        if s.use.pod_uid == pod.uid:
            out += [(STARVED, r) for r, v in s.verdicts.items() if v]
    for links in snap.pod_links:
        if links.pod_uid == pod.uid:
            out += [("gpu_link", r) for r, v in links.verdicts.items() if v]
    return sorted(set(out))

"""Devices (pure): which pod container uses which GPU or MIG slice — by the kubelet's
allocations, the pods' DRA claims, or NVML's processes — and the verdict device_remote."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from numaguard.contract.names import mig_resource
from numaguard.exporter.model.placement import PodState
from numaguard.exporter.readers.dra import DraView, device_plugin_id
from numaguard.exporter.readers.podresources import ContainerResources
from numaguard.exporter.records import GpuReading, GpuRecord, PodMeta, SliceRecord


@dataclass(slots=True)
class DeviceUse:
    """A pod container on a GPU or MIG slice."""

    gpu: GpuRecord
    mig: SliceRecord | None
    resource: str  # the extended resource it stands for: nvidia.com/gpu, nvidia.com/mig-1g.10gb
    pod_uid: str
    container_id: str
    namespace: str  # names are "" without API metadata
    pod: str
    container: str
    source: str  # kubelet (PodResources) | claim (a DRA ResourceClaim) | process (NVML's)
    pod_state: PodState | None = None  # the pod as this cycle sees it, when its cgroup is


def device_uses(
    gpus: GpuReading,
    pods: tuple[PodState, ...],
    granted: Mapping[tuple[str, str, str], ContainerResources] | None,
    metadata: Mapping[str, PodMeta],
    find: DeviceFinder,
) -> tuple[DeviceUse, ...]:
    """Who uses which GPU or slice: the kubelet's allocations first (device plugins'
    ids, and DRA devices by what their ResourceSlice says they are), then the node's
    pods' ResourceClaims for what the kubelet did not name; NVML's processes for the
    devices neither says anything about (no kubelet, or devices handed out some other
    way, such as a privileged pod that sees them all)."""
    given = _GivenDevices(metadata)
    for (namespace, pod, container), resources in (granted or {}).items():
        for d in resources.devices:
            for device_id in d.ids:
                unit = find.plugin_device(device_id)
                if unit is not None:
                    given.add(unit, d.resource, namespace, pod, container, "kubelet")
        for c in resources.claims:
            unit = find.dra_device(c.driver, c.pool, c.device)
            if unit is not None:
                given.add(unit, c.driver, namespace, pod, container, "kubelet")
    told = {(pod, uuid) for pod, _, uuid in given.seen}  # what the kubelet said goes first
    for uid, meta in metadata.items():
        for claim, containers in meta.claims.items():
            for a in find.dra.allocations.get((meta.namespace, claim), ()) if find.dra else ():
                unit = find.dra_device(a.driver, a.pool, a.device)
                if unit is None or (uid, (unit[1] or unit[0]).uuid) in told:
                    continue
                for container in containers:
                    given.add(unit, a.driver, meta.namespace, meta.name, container, "claim", uid)
    claimed = {uuid for _, _, uuid in given.seen}
    return (*given.uses, *_process_uses(gpus, pods, claimed))


class _GivenDevices:
    """Devices handed to containers by name (the kubelet's answer, the claims), each
    (pod, container, device) once, whoever says it first."""

    def __init__(self, metadata: Mapping[str, PodMeta]) -> None:
        self.metadata = metadata
        self.by_name = {(m.namespace, m.name): (uid, m) for uid, m in metadata.items()}
        self.uses: list[DeviceUse] = []
        self.seen: set[tuple[str, str, str]] = set()  # (pod, container, device uuid)

    def add(
        self,
        unit,
        resource: str,
        namespace: str,
        pod: str,
        container: str,
        source: str,
        uid: str | None = None,
    ) -> None:
        """``uid``: the pod's, when known; else the pod of that name (the kubelet names
        pods, not uids)."""
        if uid is None:
            uid, meta = self.by_name.get((namespace, pod), ("", None))
        else:
            meta = self.metadata.get(uid)
        key = (uid or f"{namespace}/{pod}", container, (unit[1] or unit[0]).uuid)
        if key in self.seen:
            return
        self.seen.add(key)
        container_id = (
            next((cid for cid, n in meta.containers.items() if n == container), "") if meta else ""
        )
        self.uses.append(
            DeviceUse(
                unit[0], unit[1], resource, uid, container_id, namespace, pod, container, source
            )
        )


def _process_uses(
    gpus: GpuReading, pods: tuple[PodState, ...], claimed: set[str]
) -> list[DeviceUse]:
    """The devices nobody named, by the pods of the processes NVML sees on them."""
    by_uid = {p.uid: p for p in pods}
    uses = []
    for gpu in gpus.gpus:
        found = [(None, gpu.holders, "nvidia.com/gpu", gpu.uuid)] + [
            (s, s.holders, mig_resource(s.profile), s.uuid) for s in gpu.slices
        ]
        for mig, holders, resource, uuid in found:
            if uuid in claimed:
                continue
            for h in holders:
                pod = by_uid.get(h.pod_uid)
                container = (
                    next((c.name for c in pod.containers if c.container_id == h.container_id), "")
                    if pod
                    else ""
                )
                namespace, name = (pod.namespace, pod.name) if pod else ("", "")
                uses.append(
                    DeviceUse(
                        gpu,
                        mig,
                        resource,
                        h.pod_uid,
                        h.container_id,
                        namespace,
                        name,
                        container,
                        "process",
                    )
                )
    return uses


class DeviceFinder:
    """The GPU or slice a device plugin's id or a DRA device names."""

    def __init__(self, gpus: GpuReading, dra: DraView | None) -> None:
        self.dra = dra
        self.units: dict[str, tuple[GpuRecord, SliceRecord | None]] = {}
        self.by_index: dict[int, GpuRecord] = {}
        for gpu in gpus.gpus:
            self.by_index[gpu.index] = gpu
            if gpu.uuid:
                self.units[gpu.uuid] = (gpu, None)
                self.units[str(gpu.index)] = (gpu, None)  # device plugins given indices
            for s in gpu.slices:
                self.units[s.uuid] = (gpu, s)
                self.units[f"MIG-{gpu.uuid}/{s.gi_id}/{s.ci_id}"] = (gpu, s)  # old plugins

    def plugin_device(self, device_id: str) -> tuple[GpuRecord, SliceRecord | None] | None:
        device_id, index, gi = device_plugin_id(device_id)
        if index is None:
            return self.units.get(device_id)
        gpu = self.by_index.get(index)  # GKE's nvidia<index>[/gi<id>]
        if gpu is None or gi is None:
            return (gpu, None) if gpu else None
        return next(((gpu, s) for s in gpu.slices if s.gi_id == gi), None)

    def dra_device(self, driver: str, pool: str, name: str):
        """By the UUID its ResourceSlice gives, or a MIG device made on demand by its
        parent and placement; None when the node's slices do not say (no guess)."""
        device = self.dra.devices.get((driver, pool, name)) if self.dra else None
        if device is None:
            return None
        if device.uuid and device.uuid in self.units:  # "" names nothing
            return self.units[device.uuid]
        parent = self.units.get(device.parent_uuid) if device.parent_uuid else None
        if parent is None or device.placement is None:
            return None
        (gpu, _), (start, size) = parent, device.placement
        # one instance at most starts on a memory slice: the start names it
        placed = (s for s in gpu.slices if s.placement_start == start)
        found = next(placed, None)
        if (
            found is None
            or size not in (None, found.placement_size)
            or device.profile not in ("", found.profile)  # another profile's instance
        ):
            return None
        return gpu, found


def with_device_verdicts(
    pods: tuple[PodState, ...], uses: tuple[DeviceUse, ...]
) -> tuple[PodState, ...]:
    """device_remote: a device the pod uses hangs off a NUMA node none of its CPUs is on.
    Decided only when the device's node and the pod's CPUs are both known."""
    device_nodes: dict[str, list[int | None]] = {}
    for use in uses:
        if use.pod_uid:
            device_nodes.setdefault(use.pod_uid, []).append(use.gpu.numa_node)
    out = []
    for pod in pods:
        nodes = device_nodes.get(pod.uid)
        if nodes and pod.cpus_by_node is not None and all(n is not None for n in nodes):
            remote = any(n not in pod.cpus_by_node for n in nodes)
            pod = replace(pod, cross_numa={**pod.cross_numa, "device_remote": remote})
        out.append(pod)
    return tuple(out)

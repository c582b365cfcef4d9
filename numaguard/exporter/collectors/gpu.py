"""GPU and MIG slice metrics: identity, memory, power once per GPU, activity per GPU and
per slice with what each can measure, which pod container uses which device, and what
each GPU's DRA counters still allow."""

from __future__ import annotations

from numaguard.contract import catalogue as c
from numaguard.exporter.collectors import Collector
from numaguard.exporter.exposition import Families, Family
from numaguard.exporter.model import NodeSnapshot
from numaguard.exporter.model.counters import CounterSetState
from numaguard.exporter.readers.dra import is_memory_slice
from numaguard.exporter.records import READ_FAILURES, Activity, GpuRecord


def families(snap: NodeSnapshot) -> list[Family]:
    f = Families("gpu", snap.node_name, snap.detail)
    _counters(f.add, snap.counters, snap.detail)
    if snap.gpus is None:
        return list(f.values())
    versions = (snap.gpus.driver_version, snap.gpus.nvml_version)
    for gpu in snap.gpus.gpus:
        _gpu(f.add, gpu, versions, snap.detail)
    for use in snap.device_uses:
        gpu = use.gpu
        f.add(
            c.GPU_HOLDER,
            1,
            str(gpu.index),
            gpu.uuid,
            use.mig.uuid if use.mig else "",
            use.resource,
            "" if gpu.numa_node is None else str(gpu.numa_node),
            use.namespace,
            use.pod,
            use.container,
            use.pod_uid,
            use.container_id,
            use.source,
        )
    _links(f.add, snap)
    for starved in snap.starvation:
        use = starved.use
        for reason, verdict in starved.verdicts.items():
            f.add(
                c.GPU_STARVED,
                int(verdict),
                str(use.gpu.index),
                use.gpu.uuid,
                use.mig.uuid if use.mig else "",
                use.namespace,
                use.pod,
                use.pod_uid,
                reason,
            )
    return list(f.values())


def _links(add, snap: NodeSnapshot) -> None:
    """How the node's GPUs reach each other, and what each multi-GPU pod got."""
    pairs = snap.gpu_pairs.values()
    compared = [p for p in pairs if p.a.pci_chain and p.b.pci_chain and p.level is not None]
    if compared:
        add(c.GPU_LINK_MISMATCH, sum(p.pcie_disagrees for p in pairs))
    for p in pairs:
        p2p = {True: "yes", False: "no", None: "unknown"}[p.p2p]
        level = p.level or "unknown"
        add(c.GPU_LINK, 1, str(p.a.index), str(p.b.index), level, str(p.nvlinks), p2p)
    for pod in snap.pod_links:
        ids = (pod.namespace, pod.pod, pod.pod_uid)
        if pod.worst is not None:
            add(c.POD_GPU_LINK, 1, *ids, pod.worst)
        if pod.p2p is not None:
            for state, n in pod.p2p.items():
                add(c.POD_GPU_P2P, n, *ids, state)
        for reason, verdict in pod.verdicts.items():
            add(c.POD_GPU_LINK_POOR, int(verdict), *ids, reason)
    for pod in snap.pair_breakers:
        for reason, verdict in pod.verdicts.items():
            add(c.POD_GPU_FRAGMENTING, int(verdict), pod.namespace, pod.pod, pod.pod_uid, reason)


def _gpu(add, gpu: GpuRecord, versions: tuple[str, str], detail: bool) -> None:
    """One GPU's series and its slices'."""
    ids = (str(gpu.index), gpu.uuid)
    add(c.GPU_UP, int(gpu.up), *ids)
    if not gpu.uuid:
        return  # never named: nothing else to say about it
    numa = "" if gpu.numa_node is None else str(gpu.numa_node)
    mig_mode = {True: "enabled", False: "disabled", None: ""}[gpu.mig_enabled]
    add(c.GPU_INFO, 1, *ids, gpu.name, gpu.pci_address, numa, mig_mode, *versions)
    if not gpu.up:
        return
    add(c.GPU_POWER, gpu.power_watts, *ids)
    add(c.GPU_TEMPERATURE, gpu.temperature_celsius, *ids)
    add(c.GPU_MEMORY_TOTAL, gpu.memory_total_bytes, *ids)
    add(c.GPU_MEMORY_USED, gpu.memory_used_bytes, *ids)
    add(c.GPU_PROCESSES, gpu.processes, *ids)
    _activity(add, gpu.activity, ids, c.GPU_UTILIZATION, c.GPU_UTILIZATION_SUPPORTED, c.GPU_PCIE)
    # left out where its links, or whether something measures them, are unknown
    measured = gpu.activity.nvlink_supported if gpu.nvlinks else None
    if gpu.nvlinks == 0:
        measured = False  # no NVLink to measure
    if measured is not None:
        add(c.GPU_NVLINK_SUPPORTED, int(measured), *ids)
    for direction, value in gpu.activity.nvlink_bytes_per_second.items() if measured else ():
        add(c.GPU_NVLINK, value, *ids, direction)
    for s in gpu.slices:
        labels = (*ids, s.uuid, s.profile)
        add(
            c.MIG_INFO,
            1,
            *labels,
            str(s.gi_id),
            str(s.ci_id),
            "" if s.placement_start is None else str(s.placement_start),
            "" if s.placement_size is None else str(s.placement_size),
        )
        add(c.MIG_SMS, s.sm_count, *labels)
        add(c.MIG_MEMORY_TOTAL, s.memory_total_bytes, *labels)
        add(c.MIG_MEMORY_USED, s.memory_used_bytes, *labels)
        add(c.MIG_PROCESSES, s.processes, *labels)
        # a slice's kinds that can be measured show in its utilization: by default only
        # those that cannot are said (a GPU's slices share its one answer)
        _activity(
            add,
            s.activity,
            labels,
            c.MIG_UTILIZATION,
            c.MIG_UTILIZATION_SUPPORTED,
            c.MIG_PCIE,
            every_supported=detail,
        )


def _counters(add, counters: tuple[CounterSetState, ...], detail: bool) -> None:
    """Each DRA counter set's capacity and consumption (a memory slice's only with
    --detail: 16 series a GPU that mig_info's placements already show), the MIG profiles
    that still fit on its GPU, and where the claims and NVML's GPU instances disagree."""
    for state in counters:
        ids = (state.driver, state.name, state.gpu_uuid)
        for counter, value in sorted(state.capacity.items()):
            if is_memory_slice(counter) and not detail:
                continue
            add(c.DRA_COUNTER, value, *ids, counter, "capacity")
            if state.consumed is not None:
                add(c.DRA_COUNTER, state.consumed.get(counter, 0), *ids, counter, "consumed")
        for profile, free in sorted((state.profiles_free or {}).items()):
            add(c.GPU_MIG_PROFILES_FREE, free, *ids, profile)
        for kind, slices in (state.mismatches or {}).items():
            add(c.DRA_COUNTER_MISMATCH, slices, *ids, kind)


def _activity(
    add, activity: Activity, labels, utilization, supported, pcie, every_supported=True
) -> None:
    for kind, can in activity.supported.items():
        if every_supported or not can:
            add(supported, int(can), *labels, kind)
    for kind, value in activity.utilization.items():
        add(utilization, value, *labels, kind)
    for direction, value in activity.pcie_bytes_per_second.items():
        add(pcie, value, *labels, direction)


COLLECTOR = Collector(
    name="gpu",
    help="GPUs and MIG slices (NVML; see --gpu-backend)",
    source="numaguard.exporter.sources.gpu",
    families=families,
    reading="gpus",
    errors=(*READ_FAILURES, "gpu_lost", "nvml", "driver"),
)

"""GPU links (pure): how each pair of the node's full GPUs reaches the other, from
NVML's answers (and sysfs's PCI tree where NVML cannot say), and what that means for
each pod holding several GPUs or slices: the worst pair it got, which pairs can do P2P,
and the verdict link_poor with its reason:

* ``no_p2p``: two of its full GPUs joined beyond PXB (NCCL uses P2P only up to it by
  default: phb, node and sys stage every transfer through host memory), or refused P2P
  read or write by the driver;
* ``split_containers``: its devices are in different containers (NCCL cannot use CUDA
  IPC, nor so NVLink, between GPUs it does not see together, NVIDIA/nccl#324);
* ``mig_slices``: two or more MIG slices (no P2P between slices, not even of one GPU).

NVLink counts as joined when the two have links between them, or NVML says NVLink P2P
works between them (both on NVSwitches). A reason whose data is missing is left out,
never guessed.

And what a new multi-GPU pod could still get: for 2, 4 and 8 GPUs the kubelet has not
handed out, the best level of such a set on each NUMA node (the Topology Manager's
single-numa-node policy keeps a pod's GPUs on one) and anywhere on the node; and which
single-GPU pods stand in its way, each holding half of the only joined pairs left on
its NUMA node (NVIDIA/k8s-device-plugin#1193)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from numaguard.contract.reasons import (
    BREAKS_PAIR,
    FREE_SET_SIZES,
    JOINED_LEVELS,
    LINK_LEVELS,
    MIG_SLICES,
    NO_P2P,
    P2P_UP_TO,
    SPLIT_CONTAINERS,
)
from numaguard.exporter.model.devices import DeviceFinder, DeviceUse
from numaguard.exporter.readers.nvml import pci_level
from numaguard.exporter.readers.podresources import Allocatable, PodResources
from numaguard.exporter.records import GpuRecord, LinkRecord

P2P_OK = 0  # NVML_P2P_STATUS_OK


@dataclass(frozen=True, slots=True)
class Pair:
    a: GpuRecord
    b: GpuRecord
    level: str | None  # LINK_LEVELS; None unknown
    p2p: bool | None  # P2P read and write work (or NVLink does)
    nvlinks: int  # direct links, or the fewer of their NVSwitch links; 0 over PCIe
    pcie_disagrees: bool  # NVML's PCIe level is not the one sysfs's tree gives


@dataclass(frozen=True, slots=True)
class PodLinks:
    namespace: str
    pod: str
    pod_uid: str
    worst: str | None  # of its full GPUs' pairs; None with fewer than two, or unknown
    p2p: Mapping[str, int] | None  # pairs by "ok" / "no"; None when one is unknown
    verdicts: dict[str, bool] = field(default_factory=dict)  # link_poor, by reason


def pairs(gpus: tuple[GpuRecord, ...]) -> dict[tuple[int, int], Pair]:
    """Each pair of full GPUs (by index, the lower first) that NVML or sysfs says
    anything of."""
    by_index = {g.index: g for g in gpus if g.up}
    out = {}
    for a in by_index.values():
        for link in a.links:
            b = by_index.get(link.peer)
            if b is not None:
                out[a.index, b.index] = _pair(a, b, link)
    return out


def _pair(a: GpuRecord, b: GpuRecord, link: LinkRecord) -> Pair:
    sysfs = None
    if a.pci_chain and b.pci_chain:
        sysfs = pci_level(a.pci_chain, b.pci_chain, a.numa_node, b.numa_node)
    pcie = link.level or sysfs
    switched = min(a.nvswitch_links or 0, b.nvswitch_links or 0)
    if link.nvlinks:
        level, nvlinks = "nvlink", link.nvlinks
    elif link.p2p_nvlink == P2P_OK:
        level, nvlinks = "nvlink", switched
    elif link.p2p_nvlink is not None or link.nvlinks == 0:
        level, nvlinks = pcie, 0
    else:
        level, nvlinks = None, 0  # NVLink not known either way
    p2p = None
    if level == "nvlink":
        p2p = True
    elif link.p2p_read is not None and link.p2p_write is not None:
        p2p = link.p2p_read == P2P_OK and link.p2p_write == P2P_OK
    disagrees = link.level is not None and sysfs is not None and link.level != sysfs
    return Pair(a, b, level, p2p, nvlinks, disagrees)


def pod_links(uses: tuple[DeviceUse, ...], pairs: Mapping[tuple[int, int], Pair]):
    """For each pod holding two or more GPUs or slices, its PodLinks."""
    by_pod: dict[str, list[DeviceUse]] = {}
    for use in uses:
        by_pod.setdefault(use.pod_uid, []).append(use)
    out = []
    for uid, held in by_pod.items():
        units = {(u.gpu.index, u.mig.uuid if u.mig else ""): u for u in held}
        if len(units) < 2:
            continue
        whole = sorted({i for i, mig in units if not mig})
        slices = [k for k in units if k[1]]
        containers = {u.container_id or u.container for u in held}
        verdicts = {SPLIT_CONTAINERS: len(containers) > 1, MIG_SLICES: len(slices) > 1}
        worst, p2p = None, None
        if len(whole) > 1:
            joined = [pairs.get((x, y)) for i, x in enumerate(whole) for y in whole[i + 1 :]]
            levels = [p.level if p else None for p in joined]
            if None not in levels:
                worst = max(levels, key=LINK_LEVELS.index)
            oks = [p.p2p if p else None for p in joined]
            if None not in oks:
                p2p = {"ok": sum(oks), "no": len(oks) - sum(oks)}
            beyond = worst is not None and LINK_LEVELS.index(worst) > LINK_LEVELS.index(P2P_UP_TO)
            if beyond or (p2p is not None and p2p["no"]):
                verdicts[NO_P2P] = True
            elif worst is not None and p2p is not None:
                verdicts[NO_P2P] = False
        first = held[0]
        out.append(PodLinks(first.namespace, first.pod, uid, worst, p2p, verdicts))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class FreeSet:
    numa_node: int | None  # None: anywhere on the node
    size: int
    level: str  # the worst pair of the best such set (LINK_LEVELS)


def free_gpus(
    find: DeviceFinder, pods: tuple[PodResources, ...] | None, allocatable: Allocatable | None
) -> list[GpuRecord] | None:
    """Full GPUs (MIG off) the kubelet may hand out through a device plugin and has not;
    None when it is silent."""
    if pods is None or allocatable is None:
        return None

    def gpus_of(devices) -> set[int]:
        units = (find.plugin_device(i) for d in devices for i in d.ids)
        return {u[0].index for u in units if u is not None and u[1] is None}

    offered = gpus_of(allocatable.devices)
    taken = gpus_of(d for p in pods for c in p.containers for d in c.devices)
    return [
        g
        for g in find.by_index.values()
        if g.up and g.mig_enabled is False and g.index in offered - taken
    ]


def free_sets(free: list[GpuRecord], pairs: Mapping[tuple[int, int], Pair]) -> tuple[FreeSet, ...]:
    """For each size and NUMA node (and the whole node), the best level a set of that
    many free GPUs reaches, where one exists. A pair of unknown level joins no set: the
    level is never better than what is known."""
    zones = sorted({g.numa_node for g in free if g.numa_node is not None})
    out = []
    for size in FREE_SET_SIZES:
        for zone in (None, *zones):
            members = sorted(g.index for g in free if zone is None or g.numa_node == zone)
            level = _best_level(members, size, pairs)
            if level is not None:
                out.append(FreeSet(zone, size, level))
    return tuple(out)


def _best_level(members: list[int], size: int, pairs: Mapping[tuple[int, int], Pair]):
    if len(members) < size:
        return None
    rank = {k: LINK_LEVELS.index(p.level) for k, p in pairs.items() if p.level is not None}
    for worst, level in enumerate(LINK_LEVELS):

        def joined(a: int, b: int, worst: int = worst) -> bool:
            return rank.get((a, b), len(LINK_LEVELS)) <= worst

        if _clique([], members, size, joined):
            return level
    return None


def _clique(chosen: list[int], candidates: list[int], size: int, joined) -> bool:
    """Whether ``size`` GPUs, ``chosen`` among them, are pairwise joined (candidates in
    index order, each joined to all chosen)."""
    if len(chosen) == size:
        return True
    for i, g in enumerate(candidates):
        if len(chosen) + len(candidates) - i < size:
            return False
        rest = [h for h in candidates[i + 1 :] if joined(g, h)]
        if _clique([*chosen, g], rest, size, joined):
            return True
    return False


def pair_breakers(
    uses: tuple[DeviceUse, ...], pairs: Mapping[tuple[int, int], Pair], free: list[GpuRecord]
) -> tuple[PodLinks, ...]:
    """For each pod holding one full GPU of the device plugin's and nothing else, the
    verdict ``breaks_pair``: its GPU and a free one on its NUMA node are joined at
    P2P_UP_TO or better, while no two free GPUs there are; left out where a level it
    rests on is unknown."""
    free_by_zone: dict[int, list[int]] = {}
    for g in free:
        if g.numa_node is not None:
            free_by_zone.setdefault(g.numa_node, []).append(g.index)

    def level(a: int, b: int) -> str | None:
        p = pairs.get((min(a, b), max(a, b)))
        return p.level if p else None

    by_pod: dict[str, list[DeviceUse]] = {}
    for use in uses:
        by_pod.setdefault(use.pod_uid, []).append(use)
    out = []
    for uid, held in by_pod.items():
        units = {(u.gpu.index, u.mig.uuid if u.mig else "") for u in held}
        use = held[0]
        if len(units) != 1 or use.mig or use.source != "kubelet" or use.gpu.numa_node is None:
            continue
        others = free_by_zone.get(use.gpu.numa_node, [])
        levels = [level(use.gpu.index, f) for f in others]
        levels += [level(a, b) for i, a in enumerate(others) for b in others[i + 1 :]]
        if None in levels:
            continue
        partner = any(level(use.gpu.index, f) in JOINED_LEVELS for f in others)
        if len(others) > 1:
            partner = partner and _best_level(sorted(others), 2, pairs) not in JOINED_LEVELS
        out.append(PodLinks(use.namespace, use.pod, uid, None, None, {BREAKS_PAIR: partner}))
    return tuple(out)

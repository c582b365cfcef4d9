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
never guessed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from numaguard.exporter.model.devices import DeviceUse
from numaguard.exporter.readers.nvml import LINK_LEVELS, P2P_UP_TO, pci_level
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
        verdicts = {"split_containers": len(containers) > 1, "mig_slices": len(slices) > 1}
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
                verdicts["no_p2p"] = True
            elif worst is not None and p2p is not None:
                verdicts["no_p2p"] = False
        first = held[0]
        out.append(PodLinks(first.namespace, first.pod, uid, worst, p2p, verdicts))
    return tuple(out)

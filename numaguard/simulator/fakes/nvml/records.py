"""What a fake GPU is — its model, slices, processes and activity — and the ctypes
helpers the fake's C functions share."""

from __future__ import annotations

import ctypes
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field

import pynvml as N

from numaguard.simulator.fakes.gpu_models import Model, Profile

MIB = 1 << 20


# What a GPU or slice is doing: GPM metric -> activity in 0..1 (PCIe: bytes/s).
ACTIVITY_METRICS = {
    "sm": N.NVML_GPM_METRIC_SM_UTIL,
    "graphics": N.NVML_GPM_METRIC_GRAPHICS_UTIL,
    "sm_occupancy": N.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor": N.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "dram_bandwidth": N.NVML_GPM_METRIC_DRAM_BW_UTIL,
    "pcie_tx": N.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    "pcie_rx": N.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    "nvlink_tx": N.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
    "nvlink_rx": N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
}
# bytes a second (GPM gives MiB/s), and a slice's counts whole on its GPU
RATES = {"pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx"}


@dataclass
class Process:
    pid: int
    used_bytes: int


@dataclass
class Activity:
    """Integrates activity over time, as GPM counters do."""

    now: Callable[[], float]
    rates: dict[str, float] = field(default_factory=dict)
    integrals: dict[str, float] = field(default_factory=dict)
    since: float = 0.0

    def __post_init__(self) -> None:
        self.since = self.now()

    def set(self, **rates: float) -> None:
        self._accrue()
        self.rates.update(rates)

    def snapshot(self) -> tuple[float, dict[str, float]]:
        self._accrue()
        return self.since, dict(self.integrals)

    def _accrue(self) -> None:
        t = self.now()
        dt = t - self.since
        for kind, rate in self.rates.items():
            self.integrals[kind] = self.integrals.get(kind, 0.0) + rate * dt
        self.since = t


@dataclass
class FakeSlice:
    profile: Profile
    gi_id: int
    ci_id: int
    placement_start: int
    uuid: str
    activity: Activity
    memory_used_bytes: int = 0
    processes: list[Process] = field(default_factory=list)


@dataclass
class FakeGpu:
    model: Model
    uuid: str
    pci_bus_id: str  # NVML's form: 00000000:18:00.0
    numa_node: int
    activity: Activity
    memory_used_bytes: int = 0
    power_milliwatts: int = 300_000
    temperature_c: int = 40
    mig: list[FakeSlice] | None = None  # None: MIG off
    processes: list[Process] = field(default_factory=list)
    slices_made: int = 0  # a MIG device's UUID is never given twice, as the driver does
    instances_made: int = 0  # nor a GPU instance id
    dynamic_mig: bool = False  # NVIDIA's DRA driver makes its slices as claims come
    # where it sits on PCIe (gpu_topology.py lays out known machines): its host bridge
    # ("": one of its own), the PCIe switch above it and the switch above that ("": none)
    pci_root: str = ""
    pci_switch: str = ""
    pci_upstream: str = ""
    # its NVLinks, in link order: each a peer GPU's index, or an NVSwitch's bus id
    nvlinks: list[int | str] = field(default_factory=list)

    @property
    def host_bridge(self) -> str:
        return self.pci_root or f"{self.pci_bus_id[4:8].lower()}:{self.pci_bus_id[9:11].lower()}"

    @property
    def memory_total_bytes(self) -> int:
        return self.model.memory_mib * MIB


def lay_out_slices(profiles: list[Profile], taken: set[int]) -> list[int] | None:
    """A start for each profile, in order, on memory slices none other takes (the
    lowest first, as mig-parted's layouts put them); None when they cannot all fit."""
    if not profiles:
        return []
    first, *rest = profiles
    for start in first.placements:
        mine = set(range(start, start + first.memory_slices))
        if start + first.memory_slices <= 8 and not mine & taken:
            others = lay_out_slices(rest, taken | mine)
            if others is not None:
                return [start, *others]
    return None


def slices_free(gpu: FakeGpu, start: int, size: int) -> bool:
    """Memory slices start..start+size-1 exist and no instance of the GPU holds one."""
    taken = {
        i
        for s in gpu.mig or []
        for i in range(s.placement_start, s.placement_start + s.profile.memory_slices)
    }
    return start + size <= 8 and not taken & set(range(start, start + size))


def make_uuid(kind: int, node: int, serial: int) -> uuidlib.UUID:
    return uuidlib.UUID(int=kind << 100 | node << 32 | serial)


def set_rates(activity: Activity, rates: dict[str, float]) -> None:
    activity.set(**{**dict.fromkeys(activity.rates, 0.0), **rates})


def add_slices(integrals: dict[str, float], gpu: FakeGpu, slices: list[FakeSlice]) -> None:
    for s in slices:
        share = s.profile.sm_count / gpu.model.sm_count
        for kind, value in s.activity.snapshot()[1].items():
            weight = 1.0 if kind in RATES else share
            integrals[kind] = integrals.get(kind, 0.0) + value * weight


def address_of(pointer) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


def set_address(pointer, address: int) -> None:
    ctypes.c_void_p.from_buffer(pointer).value = address

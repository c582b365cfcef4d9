"""A fake NVML driver library, at the C boundary.

pynvml calls into ``libnvidia-ml.so`` through ctypes: it looks every C function up on
its ``nvmlLib`` object, passes ctypes arguments (``byref`` out-parameters, string
buffers, structs) and turns the returned code into a real ``NVMLError_*`` subclass.
``FakeNvml`` stands in for that library object, so the exporter runs all of pynvml's
own code — struct layouts, the two-call process listing, error mapping — against GPUs
described in Python: models, MIG layouts, utilization, memory and processes. Failures
and hangs can be injected per C function and GPU.

GPM is modelled as the hardware does it: each GPU and slice integrates its activity
over time; a sample records the integrals at an instant and a metric is the average
between two samples, so a reading depends on the time between them, as on a real GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import threading
import time
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pynvml as N

from numaguard.simulator.fakes.gpu_models import BRANCHES, MODELS, DriverBranch, Model, Profile

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
_RATES = {"pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx"}


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


def _layout(profiles: list[Profile], taken: set[int]) -> list[int] | None:
    """A start for each profile, in order, on memory slices none other takes (the
    lowest first, as mig-parted's layouts put them); None when they cannot all fit."""
    if not profiles:
        return []
    first, *rest = profiles
    for start in first.placements:
        mine = set(range(start, start + first.memory_slices))
        if start + first.memory_slices <= 8 and not mine & taken:
            others = _layout(rest, taken | mine)
            if others is not None:
                return [start, *others]
    return None


def _free(gpu: FakeGpu, start: int, size: int) -> bool:
    """Memory slices start..start+size-1 exist and no instance of the GPU holds one."""
    taken = {
        i
        for s in gpu.mig or []
        for i in range(s.placement_start, s.placement_start + s.profile.memory_slices)
    }
    return start + size <= 8 and not taken & set(range(start, start + size))


class FakeNvml:
    """Stands in for pynvml's ``nvmlLib``; ``install()`` puts it in place."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        node_id: int = 0,
        branch: DriverBranch = BRANCHES["R580"],
    ) -> None:
        self.clock = clock
        self.node_id = node_id  # keeps UUIDs apart between the nodes of a simulated cluster
        self.branch = branch
        self._followed: tuple[str, float] | None = None  # (description file, its mtime)
        self.gpus: list[FakeGpu] = []
        self.failures: dict[tuple[str, int | None], int] = {}  # (C function, gpu) -> code
        self.hangs: set[tuple[str, int | None]] = set()
        self.release = threading.Event()  # set to let hung calls return
        self.calls: Counter[tuple[str, int | None]] = Counter()  # (C function, GPU) -> calls
        self._handles: dict[int, tuple[int, int | None]] = {}  # token -> (gpu, slice index)
        self._samples: dict[int, tuple[int, int | None, float, dict[str, float]] | None] = {}
        self._next_token = 0x1000
        # (GPU, GPU, P2P caps index) -> the status NVML gives, over what topology says
        self.p2p: dict[tuple[int, int, int], int] = {}

    # -- describing the node ------------------------------------------------------

    def add_gpu(
        self,
        model: str,
        numa_node: int,
        mig: list[str] | None = None,
        memory_used_bytes: int = 0,
        **activity: float,
    ) -> FakeGpu:
        """A GPU of ``model`` on ``numa_node``; ``mig`` lists its slices' profiles."""
        index = len(self.gpus)
        gpu = FakeGpu(
            MODELS[model],
            f"GPU-{_uuid(0x6A0, self.node_id, index)}",
            f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            numa_node,
            Activity(self.clock),
            memory_used_bytes,
        )
        gpu.activity.set(**activity)
        self.gpus.append(gpu)
        if mig is not None:
            self.set_mig(index, mig)
        return gpu

    def set_mig(
        self,
        gpu_index: int,
        profiles: list[str] | None,
        uuids: list[str] | None = None,
        starts: list[int] | None = None,
    ) -> list[FakeSlice]:
        """Re-partition a GPU (None: MIG off). New GPU instance ids and new UUIDs, as
        the driver gives (``uuids`` and ``starts``: those another fake gave, to show the
        same node)."""
        gpu = self.gpus[gpu_index]
        # GPU counters never go back: what the old slices did stays in the GPU's own
        _add_slices(gpu.activity.integrals, gpu, gpu.mig or [])
        if profiles is None:
            gpu.mig = None
            return []
        gpu.activity.set(**dict.fromkeys(gpu.activity.rates, 0.0))  # busy only through slices
        starts = starts or _layout([gpu.model.profile(name) for name in profiles], set())
        if starts is None:
            raise ValueError(f"profiles {profiles} do not fit one GPU")
        gpu.mig = []
        for i, (name, start) in enumerate(zip(profiles, starts, strict=True)):
            self.make_slice(gpu_index, name, start, uuids[i] if uuids else None)
        return gpu.mig

    def make_slice(
        self, gpu_index: int, profile_name: str, start: int, uuid: str | None = None
    ) -> FakeSlice:
        """Create one GPU instance of ``profile_name`` at memory slice ``start`` (MIG
        on), as NVIDIA's DRA driver does when it prepares a DynamicMIG claim; refused,
        as by NVML, where the profile may not start or a slice is taken."""
        gpu = self.gpus[gpu_index]
        profile = gpu.model.profile(profile_name)
        if gpu.mig is None or start not in profile.placements:
            raise ValueError(f"no {profile_name} can start at memory slice {start}")
        if not _free(gpu, start, profile.memory_slices):
            raise ValueError(f"memory slices {start}+{profile.memory_slices} are taken")
        if uuid is None:
            gpu.slices_made += 1
            uuid = f"MIG-{_uuid(0x316, self.node_id, gpu_index << 16 | gpu.slices_made)}"
        gpu.instances_made += 1  # a new instance id, never one given before
        made = FakeSlice(profile, gpu.instances_made, 0, start, uuid, Activity(self.clock))
        gpu.mig.append(made)
        return made

    def destroy_slice(self, gpu_index: int, uuid: str) -> None:
        """Destroy a GPU instance; refused while processes run on it, as NVML's
        nvmlGpuInstanceDestroy answers NVML_ERROR_IN_USE."""
        gpu = self.gpus[gpu_index]
        (gone,) = (s for s in gpu.mig or [] if s.uuid == uuid)
        if gone.processes:
            raise N.NVMLError(N.NVML_ERROR_IN_USE)
        _add_slices(gpu.activity.integrals, gpu, [gone])
        gpu.mig = [s for s in gpu.mig or [] if s is not gone]

    def fail(self, function: str, gpu: int | None = None, code: int = N.NVML_ERROR_UNKNOWN):
        """Make C function ``function`` return ``code`` (for GPU index ``gpu``, or any)."""
        self.failures[(function, gpu)] = code

    def hang(self, function: str, gpu: int | None = None) -> None:
        """Make ``function`` block until ``release`` is set."""
        self.hangs.add((function, gpu))

    @classmethod
    def from_description(cls, text: str, clock: Callable[[], float] = time.monotonic):
        """A node from JSON: ``{"node_id", "branch", "gpus": [{"model", "numa_node", "mig":
        [profiles], "activity": {...}, "memory_used_bytes", "processes": [{"pid",
        "used_bytes"}], "slices": [{"uuid", "start", "activity", "memory_used_bytes",
        "processes"}]}]}``
        (``branch``: a name in BRANCHES, R580 when absent); where they sit, per GPU
        ``"pci": {"root", "switch", "upstream"}`` and ``"nvlinks"``, and ``"p2p"``: [[a,
        b, caps index, status]] over what that says."""
        d = json.loads(text)
        nvml = cls(clock, d.get("node_id", 0), BRANCHES[d.get("branch", "R580")])
        for g in d["gpus"]:
            gpu = nvml.add_gpu(g["model"], g["numa_node"])
            pci = g.get("pci", {})
            gpu.pci_root, gpu.pci_switch = pci.get("root", ""), pci.get("switch", "")
            gpu.pci_upstream = pci.get("upstream", "")
            gpu.nvlinks = list(g.get("nvlinks", []))
        nvml.p2p = {(a, b, i): status for a, b, i, status in d.get("p2p", [])}
        nvml.apply(text)
        return nvml

    def apply(self, text: str) -> None:
        """Move the node on to a new description of the same GPUs: activity, memory,
        processes and MIG layouts change in place, as on a running node (GPM counters
        carry on)."""
        for i, (gpu, g) in enumerate(zip(self.gpus, json.loads(text)["gpus"], strict=True)):
            described = [sd["uuid"] for sd in g.get("slices", []) if "uuid" in sd]
            starts = [sd["start"] for sd in g.get("slices", []) if "start" in sd]
            if (
                [s.profile.name for s in gpu.mig or []] != (g.get("mig") or [])
                or (gpu.mig is None) != (g.get("mig") is None)
                or (described and described != [s.uuid for s in gpu.mig or []])
                or (starts and starts != [s.placement_start for s in gpu.mig or []])
            ):
                self.set_mig(i, g.get("mig"), described or None, starts or None)
            _set_rates(gpu.activity, g.get("activity", {}))
            gpu.memory_used_bytes = g.get("memory_used_bytes", 0)
            gpu.processes = [Process(**p) for p in g.get("processes", [])]
            for sl, sd in zip(gpu.mig or [], g.get("slices", []), strict=False):
                _set_rates(sl.activity, sd.get("activity", {}))
                sl.memory_used_bytes = sd.get("memory_used_bytes", 0)
                sl.processes = [Process(**p) for p in sd.get("processes", [])]

    def follow(self, path: str) -> None:
        """Re-read the description file whenever it changes (checked once per cycle, when
        NVML is asked how many GPUs there are): a simulator moves the node on by
        rewriting it."""
        self._followed = (path, os.stat(path).st_mtime)

    def _reload(self) -> None:
        if self._followed is None:
            return
        path, seen = self._followed
        with contextlib.suppress(OSError, ValueError, KeyError):
            mtime = os.stat(path).st_mtime
            if mtime != seen:
                with open(path) as f:
                    self.apply(f.read())
                self._followed = (path, mtime)

    def description(self) -> str:
        """The JSON that ``from_description`` takes, for
        ``python -m numaguard.simulator.fakes.gpu_exporter PATH``."""
        gpus = []
        for gpu in self.gpus:
            model = next(k for k, m in MODELS.items() if m is gpu.model)
            d = {
                "model": model,
                "numa_node": gpu.numa_node,
                "memory_used_bytes": gpu.memory_used_bytes,
                "activity": gpu.activity.rates,
                "processes": [vars(p) for p in gpu.processes],
                "pci": {
                    "root": gpu.pci_root,
                    "switch": gpu.pci_switch,
                    "upstream": gpu.pci_upstream,
                },
                "nvlinks": gpu.nvlinks,
            }
            if gpu.mig is not None:
                d["mig"] = [s.profile.name for s in gpu.mig]
                d["slices"] = [
                    {
                        "uuid": s.uuid,
                        "start": s.placement_start,
                        "activity": s.activity.rates,
                        "memory_used_bytes": s.memory_used_bytes,
                        "processes": [vars(p) for p in s.processes],
                    }
                    for s in gpu.mig
                ]
            gpus.append(d)
        description = {"node_id": self.node_id, "branch": self.branch.name, "gpus": gpus}
        description["p2p"] = [[*key, status] for key, status in sorted(self.p2p.items())]
        return json.dumps(description, indent=1)

    # -- installing ---------------------------------------------------------------

    @contextlib.contextmanager
    def installed(self) -> Iterator[FakeNvml]:
        saved = N.nvmlLib
        N.nvmlLib = self
        N._nvmlGetFunctionPointer_cache.clear()
        try:
            yield self
        finally:
            self.release.set()
            N.nvmlLib = saved
            N._nvmlGetFunctionPointer_cache.clear()

    def install(self) -> None:
        """For a process that only ever talks to this fake (simulator.fakes.gpu_exporter)."""
        N.nvmlLib = self
        N._nvmlGetFunctionPointer_cache.clear()

    def __getattr__(self, name: str):
        impl = getattr(type(self), "_" + name, None)
        if impl is None or name in self.__dict__.get("branch", BRANCHES["R580"]).lacks:
            raise AttributeError(name)  # pynvml turns this into FunctionNotFound

        def c_function(*args):
            gpu = self._gpu_of(args[0]) if args else None
            self.calls[name, gpu] += 1
            for key in ((name, gpu), (name, None)):
                if key in self.hangs:
                    self.release.wait()
                if key in self.failures:
                    return self.failures[key]
            if gpu is not None and (name, gpu) not in self.failures:
                lost = self.failures.get(("*", gpu))
                if lost is not None:
                    return lost
            return impl(self, *args)

        return c_function

    def lose(self, gpu: int) -> None:
        """The GPU falls off the bus: every call on it answers GPU_IS_LOST."""
        self.failures[("*", gpu)] = N.NVML_ERROR_GPU_IS_LOST

    # -- handles ------------------------------------------------------------------

    def _token(self, gpu: int, slice_index: int | None) -> int:
        for token, target in self._handles.items():
            if target == (gpu, slice_index):
                return token
        self._next_token += 0x10
        self._handles[self._next_token] = (gpu, slice_index)
        return self._next_token

    def _target(self, handle) -> tuple[FakeGpu, FakeSlice | None] | None:
        found = self._handles.get(_address(handle))
        if found is None:
            return None
        gpu = self.gpus[found[0]]
        if found[1] is None:
            return gpu, None
        if gpu.mig is None or found[1] >= len(gpu.mig):
            return None  # the slice is gone: its handle is stale
        return gpu, gpu.mig[found[1]]

    def _gpu_of(self, arg) -> int | None:
        if isinstance(arg, N.c_nvmlDevice_t):
            found = self._handles.get(_address(arg))
            return found[0] if found else None
        return None

    # -- the C functions pynvml calls (named with a leading underscore) ---------------

    def _nvmlInitWithFlags(self, flags) -> int:
        return N.NVML_SUCCESS

    def _nvmlShutdown(self) -> int:
        return N.NVML_SUCCESS

    def _nvmlSystemGetDriverVersion(self, buf, size) -> int:
        buf.value = self.branch.driver_version.encode()
        return N.NVML_SUCCESS

    def _nvmlSystemGetNVMLVersion(self, buf, size) -> int:
        buf.value = self.branch.nvml_version.encode()
        return N.NVML_SUCCESS

    def _nvmlDeviceGetCount_v2(self, count) -> int:
        self._reload()
        count._obj.value = len(self.gpus)
        return N.NVML_SUCCESS

    def _nvmlDeviceGetHandleByIndex_v2(self, index, device) -> int:
        if not 0 <= index.value < len(self.gpus):
            return N.NVML_ERROR_INVALID_ARGUMENT
        _set_address(device._obj, self._token(index.value, None))
        return N.NVML_SUCCESS

    def _device(self, handle) -> tuple[FakeGpu | None, FakeSlice | None]:
        return self._target(handle) or (None, None)

    def _nvmlDeviceGetName(self, handle, buf, size) -> int:
        gpu, _ = self._device(handle)
        if gpu is None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        buf.value = gpu.model.name.encode()
        return N.NVML_SUCCESS

    def _nvmlDeviceGetUUID(self, handle, buf, size) -> int:
        gpu, sl = self._device(handle)
        if gpu is None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        buf.value = (sl.uuid if sl else gpu.uuid).encode()
        return N.NVML_SUCCESS

    def _nvmlDeviceGetPciInfo_v3(self, handle, info) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        info._obj.busId = gpu.pci_bus_id.encode()
        info._obj.busIdLegacy = gpu.pci_bus_id.encode()
        return N.NVML_SUCCESS

    def _nvmlDeviceGetNumaNodeId(self, handle, node) -> int:
        gpu, _ = self._device(handle)
        if gpu is None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        node._obj.value = gpu.numa_node
        return N.NVML_SUCCESS

    # -- topology: how two GPUs reach each other -----------------------------------

    def level(self, a: int, b: int) -> int:
        """NVML's topology level between GPUs ``a`` and ``b``, from where they sit."""
        x, y = self.gpus[a], self.gpus[b]
        if x.host_bridge != y.host_bridge:
            return N.NVML_TOPOLOGY_NODE if x.numa_node == y.numa_node else N.NVML_TOPOLOGY_SYSTEM
        if x.pci_switch and x.pci_switch == y.pci_switch:
            return N.NVML_TOPOLOGY_SINGLE
        if x.pci_upstream and x.pci_upstream == y.pci_upstream:
            return N.NVML_TOPOLOGY_MULTIPLE
        return N.NVML_TOPOLOGY_HOSTBRIDGE

    def nvlinked(self, a: int, b: int) -> bool:
        """Joined by NVLink: a link between them, or both on an NVSwitch."""
        x, y = self.gpus[a], self.gpus[b]
        switches = {t for t in x.nvlinks if isinstance(t, str)}
        return b in x.nvlinks or bool(switches & {t for t in y.nvlinks if isinstance(t, str)})

    def _pair(self, h1, h2) -> tuple[int, int] | None:
        one, two = self._handles.get(_address(h1)), self._handles.get(_address(h2))
        if one is None or two is None or one[1] is not None or two[1] is not None:
            return None  # a MIG device: ask its parent (what NVML answers is not documented)
        return one[0], two[0]

    def _nvmlDeviceGetTopologyCommonAncestor(self, h1, h2, level) -> int:
        pair = self._pair(h1, h2)
        if pair is None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        a, b = pair
        level._obj.value = N.NVML_TOPOLOGY_INTERNAL if a == b else self.level(a, b)
        return N.NVML_SUCCESS

    def _nvmlDeviceGetP2PStatus(self, h1, h2, index, status) -> int:
        if type(index) is not int:  # pynvml passes it through to ctypes as it is
            raise ctypes.ArgumentError(f"argument 3: wrong type {type(index).__name__}")
        pair = self._pair(h1, h2)
        if pair is None or index not in range(5):
            return N.NVML_ERROR_INVALID_ARGUMENT
        a, b = pair
        override = self.p2p.get((min(a, b), max(a, b), index))
        if override is not None:
            status._obj.value = override
        elif index == N.NVML_P2P_CAPS_INDEX_NVLINK:
            status._obj.value = (
                N.NVML_P2P_STATUS_OK if self.nvlinked(a, b) else N.NVML_P2P_STATUS_NOT_SUPPORTED
            )
        elif self.nvlinked(a, b) or self.level(a, b) <= N.NVML_TOPOLOGY_MULTIPLE:
            status._obj.value = N.NVML_P2P_STATUS_OK
        else:  # across host bridges: the chipset's call, refused here as most do
            status._obj.value = N.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED
        return N.NVML_SUCCESS

    def _link(self, handle, link) -> tuple[int | str | None, int]:
        """(the link's far end, NVML_SUCCESS) or (None, the error code)."""
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None or type(link) is not int or link < 0:
            return None, N.NVML_ERROR_INVALID_ARGUMENT
        if not gpu.nvlinks:
            return None, N.NVML_ERROR_NOT_SUPPORTED  # a GPU without NVLink
        if link >= len(gpu.nvlinks):
            return None, N.NVML_ERROR_INVALID_ARGUMENT  # past its link count
        return gpu.nvlinks[link], N.NVML_SUCCESS

    def _nvmlDeviceGetNvLinkState(self, handle, link, active) -> int:
        _, code = self._link(handle, link)
        if code == N.NVML_SUCCESS:
            active._obj.value = N.NVML_FEATURE_ENABLED
        return code

    def _nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link, kind) -> int:
        far, code = self._link(handle, link)
        if code == N.NVML_SUCCESS:
            kind._obj.value = (
                N.NVML_NVLINK_DEVICE_TYPE_SWITCH
                if isinstance(far, str)
                else N.NVML_NVLINK_DEVICE_TYPE_GPU
            )
        return code

    def _nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle, link, pci) -> int:
        far, code = self._link(handle, link)
        if code == N.NVML_SUCCESS:
            bus_id = far if isinstance(far, str) else self.gpus[far].pci_bus_id
            pci._obj.busId = bus_id.encode()
            pci._obj.busIdLegacy = bus_id.encode()
        return code

    def _nvmlDeviceGetMemoryInfo(self, handle, memory) -> int:
        gpu, sl = self._device(handle)
        if gpu is None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        if sl is not None:
            total, used = sl.profile.memory_mib * MIB, sl.memory_used_bytes
        else:
            total = gpu.memory_total_bytes
            used = (
                sum(s.memory_used_bytes for s in gpu.mig)
                if gpu.mig is not None
                else gpu.memory_used_bytes
            )
        memory._obj.total, memory._obj.used, memory._obj.free = total, used, total - used
        return N.NVML_SUCCESS

    def _nvmlDeviceGetPowerUsage(self, handle, milliwatts) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None:
            return N.NVML_ERROR_NOT_SUPPORTED if sl else N.NVML_ERROR_INVALID_ARGUMENT
        milliwatts._obj.value = gpu.power_milliwatts
        return N.NVML_SUCCESS

    def _nvmlDeviceGetTemperature(self, handle, sensor, celsius) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None:
            return N.NVML_ERROR_NOT_SUPPORTED if sl else N.NVML_ERROR_INVALID_ARGUMENT
        celsius._obj.value = gpu.temperature_c
        return N.NVML_SUCCESS

    def _nvmlDeviceGetUtilizationRates(self, handle, util) -> int:
        gpu, sl = self._device(handle)
        if gpu is None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        if sl is not None or gpu.mig is not None:
            return N.NVML_ERROR_NOT_SUPPORTED  # as on every MIG device
        util._obj.gpu = round(gpu.activity.rates.get("graphics", 0.0) * 100)
        util._obj.memory = round(gpu.activity.rates.get("dram_bandwidth", 0.0) * 100)
        return N.NVML_SUCCESS

    def _nvmlDeviceGetMigMode(self, handle, current, pending) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        mode = N.NVML_DEVICE_MIG_ENABLE if gpu.mig is not None else N.NVML_DEVICE_MIG_DISABLE
        current._obj.value = pending._obj.value = mode
        return N.NVML_SUCCESS

    def _nvmlDeviceGetMaxMigDeviceCount(self, handle, count) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        count._obj.value = 7 if gpu.mig is not None else 0
        return N.NVML_SUCCESS

    def _nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index, mig) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None or gpu.mig is None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        if index.value >= len(gpu.mig):
            return N.NVML_ERROR_NOT_FOUND  # an empty slot
        _set_address(mig._obj, self._token(self.gpus.index(gpu), index.value))
        return N.NVML_SUCCESS

    def _nvmlDeviceGetGpuInstanceId(self, handle, out) -> int:
        gpu, sl = self._device(handle)
        if sl is None:
            return N.NVML_ERROR_INVALID_ARGUMENT if gpu is None else N.NVML_ERROR_NOT_SUPPORTED
        out._obj.value = sl.gi_id
        return N.NVML_SUCCESS

    def _nvmlDeviceGetComputeInstanceId(self, handle, out) -> int:
        gpu, sl = self._device(handle)
        if sl is None:
            return N.NVML_ERROR_INVALID_ARGUMENT if gpu is None else N.NVML_ERROR_NOT_SUPPORTED
        out._obj.value = sl.ci_id
        return N.NVML_SUCCESS

    def _nvmlDeviceGetAttributes_v2(self, handle, attrs) -> int:
        gpu, sl = self._device(handle)
        if gpu is None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        if sl is None:
            return N.NVML_ERROR_NOT_SUPPORTED  # only for MIG devices
        a = attrs._obj
        a.multiprocessorCount = sl.profile.sm_count
        a.gpuInstanceSliceCount = sl.profile.memory_slices
        a.computeInstanceSliceCount = sl.profile.memory_slices
        a.memorySizeMB = sl.profile.memory_mib
        return N.NVML_SUCCESS

    def _nvmlDeviceGetGpuInstanceById(self, handle, gi_id, instance) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None or gpu.mig is None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        for i, s in enumerate(gpu.mig):
            if s.gi_id == gi_id:
                _set_address(instance._obj, self._token(self.gpus.index(gpu), i) + 1)
                return N.NVML_SUCCESS
        return N.NVML_ERROR_NOT_FOUND

    def _nvmlGpuInstanceGetInfo(self, instance, info) -> int:
        found = self._handles.get(_address(instance) - 1)
        if found is None or found[1] is None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        gpu = self.gpus[found[0]]
        if gpu.mig is None or found[1] >= len(gpu.mig):
            return N.NVML_ERROR_INVALID_ARGUMENT
        sl = gpu.mig[found[1]]
        i = info._obj
        i.id = sl.gi_id
        i.profileId = sl.profile.id
        i.placement.start = sl.placement_start
        i.placement.size = sl.profile.memory_slices
        return N.NVML_SUCCESS

    def _nvmlDeviceGetGpuInstanceProfileInfoByIdV(self, handle, profile_id, info) -> int:
        return self._profile_info(
            handle, info, lambda p: p.id == profile_id, N.NVML_ERROR_INVALID_ARGUMENT
        )

    def _nvmlDeviceGetGpuInstanceProfileInfoV(self, handle, profile, info) -> int:
        if not 0 <= profile < N.NVML_GPU_INSTANCE_PROFILE_COUNT:
            return N.NVML_ERROR_INVALID_ARGUMENT
        # a profile this GPU does not have
        return self._profile_info(
            handle, info, lambda p: p.index == profile, N.NVML_ERROR_NOT_SUPPORTED
        )

    def _profile_info(self, handle, info, match: Callable[[Profile], bool], missing: int) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        i = info._obj
        if i.version != N.nvmlGpuInstanceProfileInfo_v2:
            return N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        for p in gpu.model.profiles:
            if match(p):
                i.id = p.id
                i.sliceCount = p.memory_slices
                i.multiprocessorCount = p.sm_count
                i.memorySizeMB = p.memory_mib
                i.name = f"MIG {p.name}".encode()
                return N.NVML_SUCCESS
        return missing

    def _nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count, procs) -> int:
        return self._processes(handle, count, procs)

    def _nvmlDeviceGetComputeRunningProcesses_v2(self, handle, count, procs) -> int:
        return self._processes(handle, count, procs)  # the same fields for what we set

    def _processes(self, handle, count, procs) -> int:
        gpu, sl = self._device(handle)
        if gpu is None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        if sl is not None:
            running = [(p, sl) for p in sl.processes]
        elif gpu.mig is not None:
            running = [(p, s) for s in gpu.mig for p in s.processes]
        else:
            running = [(p, None) for p in gpu.processes]
        if procs is None:
            count._obj.value = len(running)
            return N.NVML_ERROR_INSUFFICIENT_SIZE if running else N.NVML_SUCCESS
        if count._obj.value < len(running):
            count._obj.value = len(running)
            return N.NVML_ERROR_INSUFFICIENT_SIZE
        for i, (p, s) in enumerate(running):
            procs[i].pid = p.pid
            procs[i].usedGpuMemory = p.used_bytes
            procs[i].gpuInstanceId = s.gi_id if s else 0xFFFFFFFF
            procs[i].computeInstanceId = s.ci_id if s else 0xFFFFFFFF
        count._obj.value = len(running)
        return N.NVML_SUCCESS

    # GPM

    def _nvmlGpmQueryDeviceSupport(self, handle, support) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        support._obj.isSupportedDevice = int(gpu.model.gpm)
        return N.NVML_SUCCESS

    def _nvmlGpmSampleAlloc(self, sample) -> int:
        self._next_token += 0x10
        self._samples[self._next_token] = None
        _set_address(sample._obj, self._next_token)
        return N.NVML_SUCCESS

    def _nvmlGpmSampleFree(self, sample) -> int:
        if self._samples.pop(_address(sample), "gone") == "gone":
            return N.NVML_ERROR_INVALID_ARGUMENT
        return N.NVML_SUCCESS

    def _nvmlGpmSampleGet(self, handle, sample) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None or _address(sample) not in self._samples:
            return N.NVML_ERROR_INVALID_ARGUMENT
        if not gpu.model.gpm:
            return N.NVML_ERROR_NOT_SUPPORTED
        at, integrals = gpu.activity.snapshot()
        if gpu.mig is not None:  # the whole GPU is its slices, weighted by their SMs
            _add_slices(integrals, gpu, gpu.mig)
        self._samples[_address(sample)] = (id(gpu), None, at, integrals)
        return N.NVML_SUCCESS

    def _nvmlGpmMigSampleGet(self, handle, gi_id, sample) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None or _address(sample) not in self._samples:
            return N.NVML_ERROR_INVALID_ARGUMENT
        if not gpu.model.gpm:
            return N.NVML_ERROR_NOT_SUPPORTED
        for s in gpu.mig or []:
            if s.gi_id == gi_id:
                self._samples[_address(sample)] = (id(gpu), gi_id, *s.activity.snapshot())
                return N.NVML_SUCCESS
        return N.NVML_ERROR_NOT_FOUND

    def _nvmlGpmMetricsGet(self, request) -> int:
        r = request._obj
        if r.version != N.NVML_GPM_METRICS_GET_VERSION:
            return N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        first = self._samples.get(_address(r.sample1))
        second = self._samples.get(_address(r.sample2))
        if first is None or second is None or first[:2] != second[:2]:
            return N.NVML_ERROR_INVALID_ARGUMENT
        elapsed = second[2] - first[2]
        if elapsed < 0.1:
            return N.NVML_ERROR_INVALID_ARGUMENT  # NVML wants samples >= 100 ms apart
        kinds = {v: k for k, v in ACTIVITY_METRICS.items()}
        for i in range(r.numMetrics):
            metric = r.metrics[i]
            kind = kinds.get(metric.metricId)
            if kind is None:
                metric.nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED
                continue
            average = (second[3].get(kind, 0.0) - first[3].get(kind, 0.0)) / elapsed
            metric.value = average / MIB if kind in _RATES else average * 100
            metric.nvmlReturn = N.NVML_SUCCESS
        return N.NVML_SUCCESS


def _uuid(kind: int, node: int, serial: int) -> uuidlib.UUID:
    return uuidlib.UUID(int=kind << 100 | node << 32 | serial)


def _set_rates(activity: Activity, rates: dict[str, float]) -> None:
    activity.set(**{**dict.fromkeys(activity.rates, 0.0), **rates})


def _add_slices(integrals: dict[str, float], gpu: FakeGpu, slices: list[FakeSlice]) -> None:
    for s in slices:
        share = s.profile.sm_count / gpu.model.sm_count
        for kind, value in s.activity.snapshot()[1].items():
            weight = 1.0 if kind in _RATES else share
            integrals[kind] = integrals.get(kind, 0.0) + value * weight


def _address(pointer) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


def _set_address(pointer, address: int) -> None:
    ctypes.c_void_p.from_buffer(pointer).value = address

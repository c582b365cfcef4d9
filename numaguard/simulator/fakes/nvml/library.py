"""The fake library object: the node's GPUs, how a test describes and breaks them, and
the C functions for devices, memory and processes (the rest in links, mig and gpm)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pynvml as N

from numaguard.simulator.fakes.gpu_models import BRANCHES, MODELS, DriverBranch
from numaguard.simulator.fakes.nvml.gpm import GpmCalls
from numaguard.simulator.fakes.nvml.links import LinkCalls
from numaguard.simulator.fakes.nvml.mig import MigCalls
from numaguard.simulator.fakes.nvml.records import (
    MIB,
    Activity,
    FakeGpu,
    FakeSlice,
    Process,
    add_slices,
    address_of,
    lay_out_slices,
    make_uuid,
    set_address,
    set_rates,
    slices_free,
)


class FakeNvml(LinkCalls, MigCalls, GpmCalls):
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
            f"GPU-{make_uuid(0x6A0, self.node_id, index)}",
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
        add_slices(gpu.activity.integrals, gpu, gpu.mig or [])
        if profiles is None:
            gpu.mig = None
            return []
        gpu.activity.set(**dict.fromkeys(gpu.activity.rates, 0.0))  # busy only through slices
        starts = starts or lay_out_slices([gpu.model.profile(name) for name in profiles], set())
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
        if not slices_free(gpu, start, profile.memory_slices):
            raise ValueError(f"memory slices {start}+{profile.memory_slices} are taken")
        if uuid is None:
            gpu.slices_made += 1
            uuid = f"MIG-{make_uuid(0x316, self.node_id, gpu_index << 16 | gpu.slices_made)}"
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
        add_slices(gpu.activity.integrals, gpu, [gone])
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
            set_rates(gpu.activity, g.get("activity", {}))
            gpu.memory_used_bytes = g.get("memory_used_bytes", 0)
            gpu.processes = [Process(**p) for p in g.get("processes", [])]
            for sl, sd in zip(gpu.mig or [], g.get("slices", []), strict=False):
                set_rates(sl.activity, sd.get("activity", {}))
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
        found = self._handles.get(address_of(handle))
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
            found = self._handles.get(address_of(arg))
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
        set_address(device._obj, self._token(index.value, None))
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

"""GPU source: GPUs and MIG slices through NVML (pynvml), re-enumerated every cycle.

The GPUs are read one after another in a worker thread, with a deadline: the GPUs after
one whose NVML calls are slow go on in another thread, and a GPU whose calls hang is
reported down (reason ``timeout``) and not asked again until its stuck call returns;
the other GPUs and ``/metrics`` carry on. Utilization comes from GPM on Hopper
and later: one sample per GPU and per slice each cycle, the metric taken between this
cycle's sample and the last one, so no scrape ever sleeps. Where a device cannot measure
a value, it is reported unsupported, never as 0.

The pynvml module is a parameter: the real one, over whichever libnvidia-ml it loaded
(tests load a fake one that serves the C calls from a description).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

from numaguard.exporter.readers import ParseError, parse_single_int
from numaguard.exporter.readers.cgroup import parse_proc_cgroup
from numaguard.exporter.readers.nvml import (
    GPM_METRIC_IDS,
    gpm_values,
    nvml_text,
    parse_profile_name,
    pci_chain,
    sysfs_pci_address,
)
from numaguard.exporter.records import (
    UNSUPPORTED,
    UTILIZATION_KINDS,
    Activity,
    GpuReading,
    GpuRecord,
    Holder,
    Issue,
    SliceRecord,
)
from numaguard.exporter.sources import read_parsed
from numaguard.exporter.sources.gpu_links import links_of, nvlink_field_rates
from numaguard.exporter.sources.nvml_calls import Caller, Lost, read_in_turn

if TYPE_CHECKING:
    from numaguard.exporter.settings import Settings

log = logging.getLogger(__name__)

# seconds; NVML refuses GPM samples closer than 100 ms by its own clock, which stamps a
# sample inside the call, a little after ours: the margin keeps a cycle from an error
_GPM_MIN_INTERVAL = 0.12


@dataclass(frozen=True, slots=True)
class _GpuStatic:
    """What a GPU's UUID fixes: asked once, not every cycle."""

    name: str
    pci_address: str
    numa_node: int | None
    pci_chain: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class _SliceStatic:
    """What a MIG device's UUID fixes: the driver gives a new UUID to every slice it
    creates, so a re-partitioned GPU's slices are asked afresh."""

    gi_id: int
    ci_id: int
    profile: str
    sm_count: int | None
    placement_start: int | None
    placement_size: int | None


class GpuUnavailable(Exception):
    """No NVML driver here: run without GPU metrics."""


class NvmlSource:
    def __init__(
        self,
        nvml: ModuleType,
        host_root: str,
        device_timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nvml = nvml
        self.host_root = host_root
        self.device_timeout = device_timeout
        self.clock = clock  # when GPM samples were taken
        self._in_flight: dict[int, Future] = {}
        self._identity: dict[int, GpuRecord] = {}  # last good reading, to name a down GPU
        self._gpm_support: dict[str, bool] = {}  # by GPU uuid
        # C functions this driver's library does not export (older branches): learnt
        # once, then not called; what they give is unknown, and no error
        self._missing: set[str] = set()
        # GPU uuid -> GPU instance profile id -> name, where the driver has no ByIdV
        self._profile_names: dict[str, dict[int, str]] = {}
        self.driver_version = self.nvml_version = ""
        self.started = False  # NVML initialised
        # GPU index -> UUID -> what it fixes, for the GPU and slices seen last cycle;
        # only what was learnt without an error is kept
        self._static: dict[int, dict[str, _GpuStatic | _SliceStatic]] = {}
        # GPU index -> (GPM sample, when taken) per GPU or slice
        self._samples: dict[int, dict[tuple, tuple[Any, float]]] = {}
        # GPU index -> (the UUIDs of it and the GPUs after it, its links to them and to
        # NVSwitches): asked again only when one of those GPUs changed
        self._links: dict = {}
        # GPU uuid -> its NVLink throughput counters last cycle (None: the driver has none)
        self._nvlink_counters: dict = {}
        self._count = 0  # GPUs NVML counted this cycle

    def start(self) -> None:
        """Initialise NVML; GpuUnavailable when the host has no NVIDIA driver."""
        n = self.nvml
        try:
            n.nvmlInit()
        except (n.NVMLError_LibraryNotFound, n.NVMLError_DriverNotLoaded) as err:
            raise GpuUnavailable(str(err)) from None
        self.started = True
        call = Caller(n, "nvml", [], self._missing)  # a version NVML won't give stays ""
        self.driver_version = nvml_text(call.optional(n.nvmlSystemGetDriverVersion))
        self.nvml_version = nvml_text(call.optional(n.nvmlSystemGetNVMLVersion))
        log.info(
            "NVML %s, driver %s",
            self.nvml_version or "(version unknown)",
            self.driver_version or "(version unknown)",
            extra={"driver_version": self.driver_version, "nvml_version": self.nvml_version},
        )

    def close(self, timeout: float = 1.0) -> None:
        """Wait a while for reads in flight; shut NVML down unless one is still stuck."""
        deadline = time.monotonic() + timeout
        for future in list(self._in_flight.values()):
            with contextlib.suppress(Exception):
                future.result(max(0.0, deadline - time.monotonic()))
        if all(f.done() for f in self._in_flight.values()):
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()

    def read(self) -> GpuReading:
        n = self.nvml
        if not self.started:  # a driver expected (--gpu-backend nvml), not loaded yet
            try:
                self.start()
            except GpuUnavailable as err:
                return GpuReading((), [Issue("driver", "nvmlInit", str(err))])
        try:
            count = n.nvmlDeviceGetCount()
        except n.NVMLError as err:
            return GpuReading(
                (), [Issue("nvml", "nvmlDeviceGetCount", str(err))], *self._versions()
            )
        self._count = count
        deadline = time.monotonic() + self.device_timeout
        futures = {}
        todo = []
        for index in range(count):
            future = self._in_flight.get(index)
            if future is None or future.done():
                # a read that outlived its deadline and finished since is stale: ask again
                future = self._in_flight[index] = Future()
                todo.append(index)
            futures[index] = future
        read_in_turn(self._read_gpu, todo, futures, deadline)
        gpus, issues = [], []
        for index, future in futures.items():
            try:
                record, gpu_issues = future.result(max(0.0, deadline - time.monotonic()))
            except (FutureTimeout, CancelledError):
                record = self._down(index, "timeout")
                gpu_issues = [
                    Issue("timeout", f"gpu{index}", f"no answer in {self.device_timeout:g}s")
                ]
            except Exception as err:  # a bug: that GPU goes unreported, the others do not
                del self._in_flight[index]
                record = self._down(index, "internal")
                gpu_issues = [Issue("internal", f"gpu{index}", repr(err))]
            else:
                del self._in_flight[index]
            gpus.append(record)
            issues.extend(gpu_issues)
        return GpuReading(tuple(gpus), issues, *self._versions())

    def _versions(self) -> tuple[str, str]:
        return self.driver_version, self.nvml_version

    # -- one GPU, in a worker thread -----------------------------------------------

    def _read_gpu(self, index: int) -> tuple[GpuRecord, list[Issue]]:
        issues: list[Issue] = []
        call = Caller(self.nvml, f"gpu{index}", issues, self._missing)
        samples = self._samples.setdefault(index, {})
        used: set[tuple] = set()
        known = self._static.get(index, {})
        self._static[index] = seen = {}
        try:
            record = self._gpu(index, call, samples, used, known, seen)
        except Lost:
            return self._down(index, "gpu_lost"), [Issue("gpu_lost", f"gpu{index}", "GPU is lost")]
        finally:
            for key in set(samples) - used:  # units gone since: free their samples
                call.optional(self.nvml.nvmlGpmSampleFree, samples.pop(key)[0])
        if record is None:
            return self._down(index, "nvml"), issues
        self._identity[index] = record
        return record, issues

    def _gpu(
        self, index: int, call: Caller, samples: dict, used: set, known: dict, seen: dict
    ) -> GpuRecord | None:
        n = self.nvml
        handle = call.optional(n.nvmlDeviceGetHandleByIndex, index)
        uuid = handle and call.optional(n.nvmlDeviceGetUUID, handle)
        if not uuid:
            return None
        static = _learnt(known, seen, uuid, call, self._gpu_static, handle)
        mig_mode = call.optional(n.nvmlDeviceGetMigMode, handle)
        mig = bool(mig_mode and mig_mode[0] == n.NVML_DEVICE_MIG_ENABLE)
        memory = call.optional(n.nvmlDeviceGetMemoryInfo, handle)
        power = call.optional(n.nvmlDeviceGetPowerUsage, handle)
        temperature = call.optional(n.nvmlDeviceGetTemperature, handle, n.NVML_TEMPERATURE_GPU)
        gpm = self._gpm_support.get(uuid)
        if gpm is None:
            failed = len(call.issues)
            support = call.optional(n.nvmlGpmQueryDeviceSupport, handle)
            gpm = bool(support and support.isSupportedDevice)
            if len(call.issues) == failed:  # known for good; an error is asked again
                self._gpm_support[uuid] = gpm

        if gpm:
            activity = self._gpm(call, samples, used, (uuid,), n.nvmlGpmSampleGet, handle)
        elif mig:
            activity = UNSUPPORTED  # no per-GPU utilization on MIG without GPM
        else:
            rates = call.optional(n.nvmlDeviceGetUtilizationRates, handle)
            activity = Activity(
                {"graphics": rates.gpu / 100} if rates is not None else {},
                {**UNSUPPORTED.supported, "graphics": rates is not None},
                {},
            )
        owners: dict[int, tuple[Holder, ...]] = {}  # pid -> holder, for this cycle
        slices: tuple[SliceRecord, ...] = ()
        processes, holders = None, ()
        if mig:
            slices = tuple(
                self._slices(call, handle, uuid, gpm, samples, used, owners, known, seen)
            )
        else:
            pids = self._pids(call, handle)
            processes = None if pids is None else len(pids)
            holders = self._holders(pids or (), owners)
        # the GPUs after it, as their last reads named them
        peers = tuple(
            g.uuid if (g := self._identity.get(j)) else "" for j in range(index + 1, self._count)
        )
        links, nvswitch_links, nvlinks = links_of(
            self.nvml, call, index, handle, uuid, peers, self._links
        )
        if nvlinks and not gpm:  # no GPM to measure them: NVML's throughput counters
            measured, rates = nvlink_field_rates(n, call, handle, uuid, self._nvlink_counters)
            activity = replace(activity, nvlink_bytes_per_second=rates, nvlink_supported=measured)
        return GpuRecord(
            index,
            uuid,
            static.name,
            static.pci_address,
            static.numa_node,
            True,
            "",
            mig,
            memory.total if memory is not None else None,
            memory.used if memory is not None else None,
            power / 1000 if power is not None else None,
            float(temperature) if temperature is not None else None,
            activity,
            processes,
            holders,
            slices,
            static.pci_chain,
            links,
            nvswitch_links,
            nvlinks,
        )

    def _gpu_static(self, call: Caller, handle) -> _GpuStatic:
        name = call.optional(self.nvml.nvmlDeviceGetName, handle) or ""
        pci = call.optional(self.nvml.nvmlDeviceGetPciInfo, handle)
        address = ""
        if pci is not None:
            try:
                address = sysfs_pci_address(pci.busId)
            except ParseError as err:
                call.issues.append(Issue("parse", f"{call.where}/busId", str(err)))
        chain = None
        if address:
            device = os.path.join(self.host_root, f"sys/bus/pci/devices/{address}")
            try:
                chain = pci_chain(os.path.realpath(device, strict=True))
            except OSError:
                pass  # no sysfs: the level comes from NVML alone
            except ParseError as err:
                call.issues.append(Issue("parse", f"{call.where}/pci", str(err)))
        return _GpuStatic(name, address, self._numa_node(call, handle, address), chain)

    def _slices(self, call, parent, gpu_uuid, gpm, samples, used, cache, known, seen):
        n = self.nvml
        for slot in range(call.optional(n.nvmlDeviceGetMaxMigDeviceCount, parent) or 0):
            handle = call.optional(
                n.nvmlDeviceGetMigDeviceHandleByIndex, parent, slot, empty_ok=True
            )
            if handle is None:
                continue
            uuid = call.optional(n.nvmlDeviceGetUUID, handle)
            static = uuid and _learnt(
                known, seen, uuid, call, self._slice_static, parent, gpu_uuid, handle
            )
            if not static:
                continue  # cannot name it: the issue is recorded
            memory = call.optional(n.nvmlDeviceGetMemoryInfo, handle)
            if gpm:
                activity = self._gpm(
                    call,
                    samples,
                    used,
                    (gpu_uuid, uuid),
                    n.nvmlGpmMigSampleGet,
                    parent,
                    static.gi_id,
                )
            else:
                activity = UNSUPPORTED  # A100: NVML has no utilization for a MIG slice
            pids = self._pids(call, handle)
            yield SliceRecord(
                uuid,
                static.profile,
                static.gi_id,
                static.ci_id,
                static.sm_count,
                static.placement_start,
                static.placement_size,
                memory.total if memory is not None else None,
                memory.used if memory is not None else None,
                activity,
                None if pids is None else len(pids),
                self._holders(pids or (), cache),
            )

    def _slice_static(self, call: Caller, parent, gpu_uuid: str, handle) -> _SliceStatic | None:
        n = self.nvml
        gi_id = call.optional(n.nvmlDeviceGetGpuInstanceId, handle)
        ci_id = call.optional(n.nvmlDeviceGetComputeInstanceId, handle)
        if gi_id is None or ci_id is None:
            return None
        attributes = call.optional(n.nvmlDeviceGetAttributes_v2, handle)
        instance = call.optional(n.nvmlDeviceGetGpuInstanceById, parent, gi_id)
        info = instance and call.optional(n.nvmlGpuInstanceGetInfo, instance)
        profile = self._profile_name(call, parent, gpu_uuid, info.profileId) if info else ""
        return _SliceStatic(
            gi_id,
            ci_id,
            profile,
            attributes.multiprocessorCount if attributes else None,
            info.placement.start if info else None,
            info.placement.size if info else None,
        )

    def _profile_name(self, call: Caller, parent, gpu_uuid: str, profile_id: int) -> str:
        """The profile's name by its id: ByIdV from R580; before it, the GPU's profiles
        by NVML profile index (V), learnt once per GPU."""
        by_id = self.nvml.nvmlDeviceGetGpuInstanceProfileInfoById
        info = call.optional(by_id, parent, profile_id)  # None at once once known missing
        if not call.lacks(by_id):
            return _parsed_profile(call, info) if info else ""
        names = self._profile_names.get(gpu_uuid)
        if names is None:
            names = self._profile_names_by_index(call, parent)
            if names is None:
                return ""
            self._profile_names[gpu_uuid] = names
        return names.get(profile_id, "")

    def _profile_names_by_index(self, call: Caller, parent) -> dict[int, str] | None:
        """Profile id -> name for every profile index the GPU has; None when NVML failed
        (asked again next time) or has no V either."""
        n = self.nvml
        names = {}
        for index in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = n.nvmlDeviceGetGpuInstanceProfileInfo(parent, index)
            except n.NVMLError_GpuIsLost:
                raise Lost from None
            except (n.NVMLError_NotSupported, n.NVMLError_InvalidArgument):
                continue  # a profile this GPU (or this driver) does not have
            except (n.NVMLError_FunctionNotFound, n.NVMLLibraryMismatchError):
                call.learn_missing("nvmlDeviceGetGpuInstanceProfileInfo")
                return None
            except n.NVMLError as err:
                call.issues.append(Issue("nvml", f"{call.where}/profiles", str(err)))
                return None
            name = _parsed_profile(call, info)
            if name:
                names[info.id] = name
        return names

    def _gpm(self, call: Caller, samples: dict, used: set, key: tuple, take, *args) -> Activity:
        """Take this cycle's GPM sample for one GPU or slice; metrics against the last one."""
        n = self.nvml
        waiting = Activity({}, dict.fromkeys(UTILIZATION_KINDS, True), {}, {}, True)
        previous, taken = samples.get(key, (None, 0.0))
        now = self.clock()
        if previous is not None and now - taken < _GPM_MIN_INTERVAL:
            used.add(key)  # too soon for NVML: measure from the older sample next time
            return waiting
        sample = call.optional(n.nvmlGpmSampleAlloc)
        if sample is None:
            return UNSUPPORTED
        if call.optional(take, *args, sample) is None:
            call.optional(n.nvmlGpmSampleFree, sample)
            return UNSUPPORTED
        samples[key] = (sample, now)
        used.add(key)
        if previous is None:  # first cycle for this unit: no interval yet
            return waiting
        request = n.c_nvmlGpmMetricsGet_t()
        request.version = n.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRIC_IDS)
        request.sample1, request.sample2 = previous, sample
        for i, metric in enumerate(GPM_METRIC_IDS):
            request.metrics[i].metricId = metric
        answer = call.optional(n.nvmlGpmMetricsGet, request)
        call.optional(n.nvmlGpmSampleFree, previous)
        if answer is None:
            return waiting
        metrics = request.metrics
        try:
            values = gpm_values(
                {
                    metrics[i].metricId: (metrics[i].nvmlReturn, metrics[i].value)
                    for i in range(len(GPM_METRIC_IDS))
                }
            )
        except ParseError as err:
            call.issues.append(Issue("parse", f"{call.where}/gpm", str(err)))
            return waiting
        return Activity(*values)

    def _pids(self, call: Caller, handle) -> list[int] | None:
        n = self.nvml
        ask = n.nvmlDeviceGetComputeRunningProcesses  # _v3: R510 on; _v2 before
        processes = call.optional(ask, handle)
        if call.lacks(ask):
            processes = call.optional(n.nvmlDeviceGetComputeRunningProcesses_v2, handle)
        return None if processes is None else sorted({p.pid for p in processes})

    def _holders(self, pids, cache: dict[int, tuple[Holder, ...]]) -> tuple[Holder, ...]:
        """Pod containers of ``pids`` from /proc/<pid>/cgroup (cached for the cycle,
        misses too: a process outside any pod is looked up once)."""
        found: dict[Holder, None] = {}
        for pid in pids:
            if pid not in cache:
                issues: list[Issue] = []  # a process that just exited is not an error
                path = os.path.join(self.host_root, f"proc/{pid}/cgroup")
                owner = read_parsed(issues, path, parse_proc_cgroup)
                cache[pid] = (Holder(*owner),) if owner else ()
            found.update(dict.fromkeys(cache[pid]))
        return tuple(found)

    def _numa_node(self, call: Caller, handle, address: str) -> int | None:
        """From sysfs (``-1``: the platform does not say), else from NVML."""
        if address:
            issues: list[Issue] = []
            path = os.path.join(self.host_root, f"sys/bus/pci/devices/{address}/numa_node")
            node = read_parsed(issues, path, parse_single_int)
            if node is not None:
                return node if node >= 0 else None
        node = call.optional(self.nvml.nvmlDeviceGetNumaNodeId, handle)
        return node if node is not None and node >= 0 else None

    def _down(self, index: int, reason: str) -> GpuRecord:
        known = self._identity.get(index)
        if known is None:
            return GpuRecord(index, "", "", "", None, False, reason)
        return GpuRecord(
            index,
            known.uuid,
            known.name,
            known.pci_address,
            known.numa_node,
            False,
            reason,
            known.mig_enabled,  # the same info series as when it was up
        )


def _learnt(known: dict, seen: dict, uuid: str, call: Caller, ask: Callable, *args):
    """What ``uuid`` fixes: known from an earlier cycle, else asked now — and kept for
    the next only when no call failed on the way (an error is asked again)."""
    static = known.get(uuid)
    if static is None:
        failed = len(call.issues)
        static = ask(call, *args)
        if static is None or len(call.issues) > failed:
            return static
    seen[uuid] = static
    return static


def _parsed_profile(call: Caller, info) -> str:
    try:
        return parse_profile_name(info.name)
    except ParseError as err:
        call.issues.append(Issue("parse", f"{call.where}/profile", str(err)))
        return ""


class GpuBackendError(Exception):
    """--gpu-backend names something that cannot be used."""


def open_source(settings: Settings) -> NvmlSource | None:
    """The GPU source for --gpu-backend; None without GPUs. Blocking (NVML init).
    auto: no driver, no GPU metrics (a node without GPUs); nvml: a GPU node, where a
    driver that cannot be loaded is the gpu collector's failure (reason driver), tried
    again every cycle (the GPU Operator's kernel module may load after us)."""
    backend = settings.gpu_backend
    if backend == "none":
        return None
    if backend not in ("auto", "nvml"):
        raise GpuBackendError(f"unknown GPU backend {backend!r}: use auto, nvml or none")
    import pynvml

    # half the collector's budget per GPU, so a hung GPU is named before the whole
    # collector times out
    source = NvmlSource(pynvml, settings.host_root, settings.collector_timeout_seconds / 2)
    try:
        source.start()
    except GpuUnavailable as err:
        if backend == "nvml":
            log.warning(
                "no NVIDIA driver (%s): the gpu collector fails (reason driver) until one "
                "loads; is the pod's RuntimeClass the NVIDIA runtime's? (a library the "
                "runtime did not mount into the pod needs the pod restarted)",
                err,
            )
            return source
        log.info("no NVIDIA driver (%s): no GPU metrics; --gpu-backend none says so quietly", err)
        return None
    return source

"""The fake's MIG C functions: modes, MIG device handles, GPU instances, profiles."""

from __future__ import annotations

from collections.abc import Callable

import pynvml as N

from numaguard.simulator.fakes.gpu_models import Profile
from numaguard.simulator.fakes.nvml.records import FakeGpu, address_of, set_address


class MigCalls:
    """Mixed into FakeNvml, whose ``gpus``, ``_handles``, ``_token`` and ``_device`` it uses."""

    gpus: list[FakeGpu]
    _handles: dict[int, tuple[int, int | None]]

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
        set_address(mig._obj, self._token(self.gpus.index(gpu), index.value))
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
                set_address(instance._obj, self._token(self.gpus.index(gpu), i) + 1)
                return N.NVML_SUCCESS
        return N.NVML_ERROR_NOT_FOUND

    def _nvmlGpuInstanceGetInfo(self, instance, info) -> int:
        found = self._handles.get(address_of(instance) - 1)
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

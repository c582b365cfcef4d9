"""The fake's GPM C functions, modelled as the hardware does it: each GPU and slice
integrates its activity over time; a sample records the integrals at an instant and a
metric is the average between two samples, so a reading depends on the time between
them, as on a real GPU."""

from __future__ import annotations

import pynvml as N

from numaguard.simulator.fakes.nvml.records import (
    ACTIVITY_METRICS,
    MIB,
    RATES,
    add_slices,
    address_of,
    set_address,
)


class GpmCalls:
    """Mixed into FakeNvml, whose ``_samples``, ``_next_token`` and ``_device`` it uses."""

    _samples: dict[int, tuple[int, int | None, float, dict[str, float]] | None]
    _next_token: int

    def _nvmlGpmQueryDeviceSupport(self, handle, support) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        support._obj.isSupportedDevice = int(gpu.model.gpm)
        return N.NVML_SUCCESS

    def _nvmlGpmSampleAlloc(self, sample) -> int:
        self._next_token += 0x10
        self._samples[self._next_token] = None
        set_address(sample._obj, self._next_token)
        return N.NVML_SUCCESS

    def _nvmlGpmSampleFree(self, sample) -> int:
        if self._samples.pop(address_of(sample), "gone") == "gone":
            return N.NVML_ERROR_INVALID_ARGUMENT
        return N.NVML_SUCCESS

    def _nvmlGpmSampleGet(self, handle, sample) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None or address_of(sample) not in self._samples:
            return N.NVML_ERROR_INVALID_ARGUMENT
        if not gpu.model.gpm:
            return N.NVML_ERROR_NOT_SUPPORTED
        at, integrals = gpu.activity.snapshot()
        if gpu.mig is not None:  # the whole GPU is its slices, weighted by their SMs
            add_slices(integrals, gpu, gpu.mig)
        self._samples[address_of(sample)] = (id(gpu), None, at, integrals)
        return N.NVML_SUCCESS

    def _nvmlGpmMigSampleGet(self, handle, gi_id, sample) -> int:
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None or address_of(sample) not in self._samples:
            return N.NVML_ERROR_INVALID_ARGUMENT
        if not gpu.model.gpm:
            return N.NVML_ERROR_NOT_SUPPORTED
        for s in gpu.mig or []:
            if s.gi_id == gi_id:
                self._samples[address_of(sample)] = (id(gpu), gi_id, *s.activity.snapshot())
                return N.NVML_SUCCESS
        return N.NVML_ERROR_NOT_FOUND

    def _nvmlGpmMetricsGet(self, request) -> int:
        r = request._obj
        if r.version != N.NVML_GPM_METRICS_GET_VERSION:
            return N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        first = self._samples.get(address_of(r.sample1))
        second = self._samples.get(address_of(r.sample2))
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
            metric.value = average / MIB if kind in RATES else average * 100
            metric.nvmlReturn = N.NVML_SUCCESS
        return N.NVML_SUCCESS

"""The fake's topology and NVLink C functions: how two GPUs reach each other."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import pynvml as N

from numaguard.simulator.fakes.nvml.records import FakeGpu, add_slices, address_of, set_address

# NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX: KiB of data since the driver loaded
THROUGHPUT_FIELDS = {
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "nvlink_tx",
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "nvlink_rx",
}
ALL_LINKS = 0xFFFFFFFF
_EPOCH_US = 1_750_000_000_000_000  # a field's timestamp: µs since 1970, as the driver's


class LinkCalls:
    """Mixed into FakeNvml, whose ``gpus``, ``p2p``, ``clock``, ``_handles`` and
    ``_device`` it uses. ``fields_missing``: field ids this driver does not know."""

    gpus: list[FakeGpu]
    clock: Callable[[], float]
    fields_missing: frozenset[int] = frozenset()
    p2p: dict[tuple[int, int, int], int]
    _handles: dict[int, tuple[int, int | None]]

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
        one, two = self._handles.get(address_of(h1)), self._handles.get(address_of(h2))
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

    def _nvmlDeviceGetTopologyNearestGpus(self, handle, level, count, devices) -> int:
        """The other GPUs joined to it at ``level`` or nearer (whether NVML counts the
        nearer ones is not documented), by pynvml's two calls: the count, then them."""
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None or type(level) is not int:
            return N.NVML_ERROR_INVALID_ARGUMENT
        a = self.gpus.index(gpu)
        near = [b for b in range(len(self.gpus)) if b != a and self.level(a, b) <= level]
        if devices is None:
            count._obj.value = len(near)
            return N.NVML_SUCCESS
        if count._obj.value < len(near):
            return N.NVML_ERROR_INSUFFICIENT_SIZE
        for i, b in enumerate(near):
            set_address(devices[i], self._token(b, None))
        count._obj.value = len(near)
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

    def _nvmlDeviceGetFieldValues(self, handle, count, values) -> int:
        """The NVLink throughput fields, over one link or all (UINT_MAX), from the GPU's
        integrated activity; each field answers for itself in its nvmlReturn."""
        gpu, sl = self._device(handle)
        if gpu is None or sl is not None or count.value < 0:
            return N.NVML_ERROR_INVALID_ARGUMENT
        at, integrals = gpu.activity.snapshot()
        if gpu.mig is not None:  # the whole GPU's links carry its slices' traffic
            add_slices(integrals, gpu, gpu.mig)
        for i in range(count.value):
            v = values._obj[i]
            kind = THROUGHPUT_FIELDS.get(v.fieldId)
            if kind is None or v.fieldId in self.fields_missing:
                v.nvmlReturn = N.NVML_ERROR_INVALID_ARGUMENT  # a field this driver lacks
            elif not gpu.nvlinks:
                v.nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED
            elif v.scopeId != ALL_LINKS and v.scopeId >= len(gpu.nvlinks):
                v.nvmlReturn = N.NVML_ERROR_INVALID_ARGUMENT
            else:
                share = 1 if v.scopeId == ALL_LINKS else len(gpu.nvlinks)
                v.value.ullVal = int(integrals.get(kind, 0.0) / share) // 1024
                v.valueType = N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                v.timestamp = _EPOCH_US + int(at * 1e6)
                v.nvmlReturn = N.NVML_SUCCESS
        return N.NVML_SUCCESS

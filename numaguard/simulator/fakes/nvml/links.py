"""The fake's topology and NVLink C functions: how two GPUs reach each other."""

from __future__ import annotations

import ctypes

import pynvml as N

from numaguard.simulator.fakes.nvml.records import FakeGpu, address_of


class LinkCalls:
    """Mixed into FakeNvml, whose ``gpus``, ``p2p``, ``_handles`` and ``_device`` it uses."""

    gpus: list[FakeGpu]
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

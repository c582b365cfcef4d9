"""Readers for NVML answers: the values pynvml hands back -> typed values.

Pure, like the file readers: no NVML calls here, only making sense of what came back.
"""

from __future__ import annotations

import math
import re

from numaguard.exporter.readers import ParseError

# GPM metric ids (pynvml's NVML_GPM_METRIC_*), fixed by the NVML ABI.
GPM_UTILIZATION = {
    "graphics": 1,  # time any compute/graphics context was active
    "sm": 2,  # share of SMs busy
    "sm_occupancy": 3,  # active warps vs the maximum
    "tensor": 5,  # time any tensor core was busy
    "dram_bandwidth": 10,  # DRAM bandwidth used vs the maximum
}
GPM_PCIE = {"tx": 20, "rx": 21}  # MiB/s
GPM_METRIC_IDS = (*GPM_UTILIZATION.values(), *GPM_PCIE.values())

# 1g.10gb, and its variants by engines: +me (with media), -me (without), +me.all, +gfx
# (RTX PRO Blackwell); a suffix not yet known is kept as it is, never dropped
_PROFILE = re.compile(r"(?:MIG )?(\d+g\.\d+gb(?:[+-][a-z][a-z0-9]*(?:\.[a-z0-9]+)*)*)")
_BUS_ID = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])")


def parse_profile_name(name: str | bytes) -> str:
    """``MIG 1g.10gb`` (nvmlDeviceGetGpuInstanceProfileInfo) -> ``1g.10gb``, the name the
    device plugin uses in ``nvidia.com/mig-1g.10gb``; ``MIG 1g.24gb-me`` -> ``1g.24gb-me``."""
    text = name.decode("ascii", "replace") if isinstance(name, bytes) else name
    m = _PROFILE.fullmatch(text.strip())
    if m is None:
        raise ParseError(f"not a MIG profile name: {text[:40]!r}")
    return m[1]


def sysfs_pci_address(bus_id: str | bytes) -> str:
    """NVML's bus id (``00000000:18:00.0``) -> the sysfs name (``0000:18:00.0``)."""
    text = bus_id.decode("ascii", "replace") if isinstance(bus_id, bytes) else bus_id
    m = _BUS_ID.fullmatch(text.strip())
    if m is None:
        raise ParseError(f"not a PCI bus id: {text[:40]!r}")
    return f"{int(m[1], 16):04x}:{m[2]}:{m[3]}.{m[4]}".lower()


def gpm_values(
    answers: dict[int, tuple[int, float]],
) -> tuple[dict[str, float], dict[str, bool], dict[str, float]]:
    """GPM metric id -> (nvmlReturn, value) into (utilization ratios by kind, whether each
    kind is supported, PCIe bytes per second by direction). A metric that did not return
    success is unsupported and has no value; values outside their range are refused."""
    utilization: dict[str, float] = {}
    supported: dict[str, bool] = {}
    pcie: dict[str, float] = {}
    for kind, metric in GPM_UTILIZATION.items():
        code, value = answers.get(metric, (-1, 0.0))
        supported[kind] = code == 0
        if code == 0:
            if not 0.0 <= value <= 100.0 + 1e-6:  # NaN fails too
                raise ParseError(f"GPM {kind} utilization {value} outside 0..100")
            utilization[kind] = min(value, 100.0) / 100.0
    for direction, metric in GPM_PCIE.items():
        code, value = answers.get(metric, (-1, 0.0))
        if code == 0:
            if not (math.isfinite(value) and value >= 0.0):
                raise ParseError(f"GPM PCIe {direction} {value} is not a rate")
            pcie[direction] = value * (1 << 20)
    return utilization, supported, pcie

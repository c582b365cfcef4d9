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
GPM_NVLINK = {"tx": 61, "rx": 60}  # MiB/s, all links together (TOTAL_TX/RX_PER_SEC)
GPM_METRIC_IDS = (*GPM_UTILIZATION.values(), *GPM_PCIE.values(), *GPM_NVLINK.values())
# Where a GPU has no GPM: nvmlDeviceGetFieldValues' NVLINK_THROUGHPUT_DATA_TX/RX, KiB of
# data since the driver loaded; the scope UINT_MAX sums all of a GPU's links (nvml.h)
NVLINK_FIELDS = {"tx": 138, "rx": 139}
ALL_LINKS = 0xFFFFFFFF
_UNSIGNED_LONG_LONG = 3  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG

# 1g.10gb, and its variants by engines: +me (with media), -me (without), +me.all, +gfx
# (RTX PRO Blackwell); a suffix not yet known is kept as it is, never dropped
_PROFILE = re.compile(r"(?:MIG )?(\d+g\.\d+gb(?:[+-][a-z][a-z0-9]*(?:\.[a-z0-9]+)*)*)")
_BUS_ID = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])")


def nvml_text(value) -> str:
    """A string NVML gave (bytes from the C library, str from some wrappers); "" for none."""
    return value.decode("ascii", "replace") if isinstance(value, bytes) else (value or "")


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
) -> tuple[dict[str, float], dict[str, bool], dict[str, float], dict[str, float], bool]:
    """GPM metric id -> (nvmlReturn, value) into (utilization ratios by kind, whether each
    kind is supported, PCIe and NVLink bytes per second by direction, whether NVLink is).
    A metric that did not return success is unsupported and has no value; values outside
    their range are refused."""
    utilization: dict[str, float] = {}
    supported: dict[str, bool] = {}
    pcie: dict[str, float] = {}
    nvlink: dict[str, float] = {}
    for kind, metric in GPM_UTILIZATION.items():
        code, value = answers.get(metric, (-1, 0.0))
        supported[kind] = code == 0
        if code == 0:
            if not 0.0 <= value <= 100.0 + 1e-6:  # NaN fails too
                raise ParseError(f"GPM {kind} utilization {value} outside 0..100")
            utilization[kind] = min(value, 100.0) / 100.0
    for name, metrics, rates in (("PCIe", GPM_PCIE, pcie), ("NVLink", GPM_NVLINK, nvlink)):
        for direction, metric in metrics.items():
            code, value = answers.get(metric, (-1, 0.0))
            if code == 0:
                if not (math.isfinite(value) and value >= 0.0):
                    raise ParseError(f"GPM {name} {direction} {value} is not a rate")
                rates[direction] = value * (1 << 20)
    return utilization, supported, pcie, nvlink, len(nvlink) == len(GPM_NVLINK)


def nvlink_counters(
    answers: list[tuple[int, int, int, int, int]],
) -> dict[str, tuple[int, int]]:
    """nvmlDeviceGetFieldValues' answers for NVLINK_FIELDS, each (fieldId, nvmlReturn,
    valueType, value, timestamp in µs) -> direction -> (KiB, timestamp); a field that did
    not return success is left out. A value of another type or without a time is refused."""
    directions = {field: direction for direction, field in NVLINK_FIELDS.items()}
    counters = {}
    for field, code, value_type, value, timestamp in answers:
        if field not in directions or code != 0:
            continue
        if value_type != _UNSIGNED_LONG_LONG:
            raise ParseError(f"NVLink field {field} has value type {value_type}, not a counter")
        if timestamp <= 0:
            raise ParseError(f"NVLink field {field} has no time ({timestamp})")
        counters[directions[field]] = (value, timestamp)
    return counters


def counter_rates(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, float]:
    """Bytes a second per direction between two readings of KiB counters; a direction
    whose counter went back (the driver reloaded) or whose time did not move has none."""
    rates = {}
    for direction, (kib, at) in after.items():
        if direction not in before:
            continue
        was, then = before[direction]
        if at > then and kib >= was:
            rates[direction] = (kib - was) * 1024 / ((at - then) / 1e6)
    return rates


# nvmlGpuTopologyLevel_t -> its name; INTERNAL (two GPUs on one board) is as close as PIX
_NVML_LEVELS = {0: "pix", 10: "pix", 20: "pxb", 30: "phb", 40: "node", 50: "sys"}
_SYSFS_PCI = re.compile(r"/sys/devices/(pci[0-9a-f]{4}:[0-9a-f]{2})((?:/[0-9a-f:.]+)+)")
_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def nvml_level(value: int) -> str:
    """nvmlDeviceGetTopologyCommonAncestor's answer -> a name of contract.reasons.LINK_LEVELS."""
    if value not in _NVML_LEVELS:
        raise ParseError(f"not an NVML topology level: {value!r}")
    return _NVML_LEVELS[value]


def pci_chain(realpath: str) -> tuple[str, ...]:
    """A PCI device's sysfs path, resolved (``/sys/devices/pci0000:00/0000:00:01.0/
    0000:18:00.0``) -> its root complex and the bridges down to it, the device last."""
    m = _SYSFS_PCI.search(realpath)
    if m is None or not realpath.endswith(m[0]):
        raise ParseError(f"not a PCI device's sysfs path: {realpath[-120:]!r}")
    parts = m[2].strip("/").split("/")
    if not all(_BDF.fullmatch(p) for p in parts):
        raise ParseError(f"not a chain of PCI addresses: {m[2][-120:]!r}")
    return (m[1], *parts)


def pci_level(a: tuple[str, ...], b: tuple[str, ...], numa_a: int | None, numa_b: int | None):
    """The level between two PCI devices from their chains alone, as the DRA helper
    derives pcieRoot and NCCL its tree: other root complexes, ``node`` on one NUMA node
    and ``sys`` across (None when a NUMA node is unknown); on one, ``phb`` when they meet
    at the root complex, else by the bridges below where they meet: one at most on
    either side ``pix``, more ``pxb``."""
    if a[0] != b[0]:
        if numa_a is None or numa_b is None:
            return None
        return "node" if numa_a == numa_b else "sys"
    shared = 0
    while shared < min(len(a), len(b)) - 1 and a[shared] == b[shared]:
        shared += 1
    if shared == 1:  # they meet at the root complex
        return "phb"
    below = max(len(a), len(b)) - shared - 1  # bridges under where they meet, the devices aside
    return "pix" if below <= 1 else "pxb"

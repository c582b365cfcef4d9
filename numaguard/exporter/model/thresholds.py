"""Where the model's verdicts are decided: when a pod's memory counts as remote, and
why and when a GPU counts as starved by its host. The exporter's flags, the catalogue's
help and the remediator (which reasons moving the pod can fix) read them from here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class StarvedReason:
    """Why a GPU may be starved by its host: low utilization while this holds."""

    name: str
    measure: str  # what is compared with its threshold; for a verdict, which one
    default: float | None  # the threshold; None: the pod's cross-NUMA verdict decides
    movable: bool  # moving the pod to an aligned NUMA zone fixes it


# the reasons of numaguard_pod_cross_numa, each a verdict of the model
CROSS_NUMA_REASONS = ("cpu_span", "memory_remote", "device_remote")

STARVED_REASONS = (
    StarvedReason("device_remote", "the pod's cross-NUMA verdict device_remote", None, True),
    StarvedReason("memory_remote", "the pod's cross-NUMA verdict memory_remote", None, True),
    StarvedReason("cpu_throttled", "share of the pod's CFS periods throttled", 0.1, False),
    StarvedReason(
        "cpu_pressure",
        "share of time some task of the pod stalled waiting for CPU (PSI)",
        0.2,
        False,
    ),
    StarvedReason(
        "memory_pressure", "share of time some task of the pod stalled on memory (PSI)", 0.1, False
    ),
    StarvedReason(
        "remote_traffic",
        "share of the pod's memory traffic that crossed to another NUMA node (resctrl)",
        0.5,
        True,
    ),
)
# the reasons decided by a host signal against a threshold, with their defaults
STARVED_THRESHOLDS = MappingProxyType(
    {r.name: r.default for r in STARVED_REASONS if r.default is not None}
)


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When a pod's memory counts as remote (verdict ``memory_remote``), and when a GPU is
    starved by its host: low utilization while one of the host signals is high."""

    memory_remote_ratio: float = 0.3
    memory_remote_min_bytes: int = 64 * MIB
    gpu_starved_utilization: float = 0.3  # SM (else graphics) activity below this is low
    # reason -> the share of its measure at or above which it starves a barely busy GPU
    # (those not given keep their defaults)
    starved: Mapping[str, float] = field(default_factory=lambda: STARVED_THRESHOLDS)

    def __post_init__(self) -> None:
        unknown = set(self.starved) - set(STARVED_THRESHOLDS)
        if unknown:
            raise ValueError(f"no starved reason decided by a threshold: {sorted(unknown)}")
        merged = MappingProxyType({**STARVED_THRESHOLDS, **self.starved})
        object.__setattr__(self, "starved", merged)  # frozen: set once, here

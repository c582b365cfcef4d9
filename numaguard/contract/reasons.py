"""The reasons of the exporter's verdicts: why a pod counts as cross-NUMA, and why and
when a GPU counts as starved by its host. The exporter decides them (model/), the
catalogue's help names them, and the remediator reads which of them moving a pod can
fix."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


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

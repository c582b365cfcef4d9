"""The PromQL the remediator evaluates each cycle: a fixed set, whatever the cluster size.

The detection expressions are written here once; the alerting rules in ``alerts/`` are
built from the same strings, so that an alert and a remediation can never disagree about
what a finding is. Metric names come from the exporter's catalogue only.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter import catalogue as c


@dataclass(frozen=True)
class Windows:
    """How long a condition must hold before it is a finding (and be gone to clear)."""

    finding: str = "10m"
    sizing: str = "1h"


def expressions(w: Windows = Windows()) -> dict[str, str]:
    """Name -> PromQL, evaluated as instant queries at the cycle's time."""
    cross = c.POD_CROSS_NUMA.name
    starved = c.GPU_STARVED.name
    return {
        # a verdict that held at every scrape of the window, and already existed at its
        # start (a new series is not yet sustained), opens a finding ...
        "cross_numa_sustained": (
            f"min_over_time({cross}[{w.finding}]) == 1 and {cross} offset {w.finding}"
        ),
        # ... and one that held at any scrape keeps it open (hysteresis)
        "cross_numa_seen": f"max_over_time({cross}[{w.finding}]) == 1",
        "starved_sustained": (
            f"min_over_time({starved}[{w.finding}]) == 1 and {starved} offset {w.finding}"
        ),
        "starved_seen": f"max_over_time({starved}[{w.finding}]) == 1",
        # MIG sizing: what each slice did over the sizing window, and what it is
        "slice_sm": (f'avg_over_time({c.MIG_UTILIZATION.name}{{kind="sm"}}[{w.sizing}])'),
        "slice_sm_peak": (f'max_over_time({c.MIG_UTILIZATION.name}{{kind="sm"}}[{w.sizing}])'),
        "slice_memory_peak": f"max_over_time({c.MIG_MEMORY_USED.name}[{w.sizing}])",
        "slice_memory_total": c.MIG_MEMORY_TOTAL.name,
        "holders": c.GPU_HOLDER.name,
        # what a pod needs to fit somewhere: its exclusive CPUs and its memory
        "pod_exclusive_cpus": (
            f"sum by (node, namespace, pod, pod_uid) ({c.CONTAINER_CPUS.name} "
            f"* on (node, pod_uid, container_id) group_left "
            f'{c.CONTAINER_INFO.name}{{exclusive_cpus="true"}})'
        ),
        "pod_memory": f"sum by (node, namespace, pod, pod_uid) ({c.POD_MEMORY.name})",
        # what each NUMA zone can still give
        "zone_free_cpus": f"{c.ZONE_CPUS_ALLOCATABLE.name} - {c.ZONE_CPUS_ALLOCATED.name}",
        "zone_free_devices": c.ZONE_DEVICES_FREE.name,
        "zone_free_memory": c.NUMA_MEMORY_FREE.name,
        # LLC: each pod's share of each L3 domain
        "llc_share": c.POD_LLC_SHARE.name,
        # freshness: when each node's collectors last succeeded, and whether they do now
        "collector_age": f"time() - {c.COLLECTOR_LAST_SUCCESS.name}",
        "collector_success": c.COLLECTOR_SUCCESS.name,
    }

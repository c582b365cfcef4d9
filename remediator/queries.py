"""The PromQL the remediator evaluates each cycle: a fixed set, whatever the cluster size.

The detection expressions are written here once; the alerting rules in ``alerts/`` are
built from the same strings, so that an alert and a remediation can never disagree about
what a finding is. Metric names come from the exporter's catalogue only, and every
selector carries the exporters' own selector (``job="numaguard"`` by default): a series
another scrape target serves is never read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter import catalogue as c
from remediator.validation import FORBID_EXTRA, Duration

EXPORTER_JOB = "numaguard"  # the exporters' scrape job, as deploy/'s ServiceMonitor names it
DEFAULT_SELECTOR = f'job="{EXPORTER_JOB}"'
_UID = re.compile(r"[0-9A-Za-z-]{1,64}")  # what the API server gives a pod, and no regex


@dataclass(frozen=True)
class Windows:
    """How long a condition must hold before it is a finding (and be gone to clear)."""

    __pydantic_config__ = FORBID_EXTRA

    finding: Duration = "10m"
    sizing: Duration = "1h"


def selected(metric: str, selector: str, *matchers: str) -> str:
    """``metric{selector,matchers...}``: the exporters' series of that metric only."""
    inside = ",".join(m for m in (selector, *matchers) if m)
    return f"{metric}{{{inside}}}" if inside else metric


def expressions(w: Windows = Windows(), selector: str = DEFAULT_SELECTOR) -> dict[str, str]:
    """Name -> PromQL, evaluated as instant queries at the cycle's time."""

    def m(spec: c.MetricSpec, *matchers: str) -> str:
        return selected(spec.name, selector, *matchers)

    cross, starved = m(c.POD_CROSS_NUMA), m(c.GPU_STARVED)
    sm = m(c.MIG_UTILIZATION, 'kind="sm"')
    exclusive = m(c.CONTAINER_INFO, 'exclusive_cpus="true"')
    return {
        # a verdict that held at every scrape of the window and at the last one before
        # it (a new series is not yet sustained) opens a finding. The sample at the
        # window's start is the offset's: Prometheus 3's ranges leave it out, 2's take
        # it in, and the two then agree ...
        "cross_numa_sustained": (
            f"min_over_time({cross}[{w.finding}]) == 1 and {cross} offset {w.finding} == 1"
        ),
        # ... and one that held at any scrape keeps it open (hysteresis)
        "cross_numa_seen": f"max_over_time({cross}[{w.finding}]) == 1",
        "starved_sustained": (
            f"min_over_time({starved}[{w.finding}]) == 1 and {starved} offset {w.finding} == 1"
        ),
        "starved_seen": f"max_over_time({starved}[{w.finding}]) == 1",
        # how old the newest sample saying so is: an action needs the verdict now
        "cross_numa_age": f"time() - timestamp({cross} == 1)",
        "starved_age": f"time() - timestamp({starved} == 1)",
        # MIG sizing: what each slice did over the whole sizing window, and what it is
        "slice_sm": f"avg_over_time({sm}[{w.sizing}]) and {sm} offset {w.sizing}",
        "slice_sm_peak": f"max_over_time({sm}[{w.sizing}])",
        "slice_memory_peak": f"max_over_time({m(c.MIG_MEMORY_USED)}[{w.sizing}])",
        "slice_memory_total": m(c.MIG_MEMORY_TOTAL),
        "slice_age": f"time() - timestamp({sm})",
        "holders": m(c.GPU_HOLDER),
        # what a pod holds, per NUMA node: its exclusive CPUs and its memory
        "pod_exclusive_cpus": (
            f"sum by (node, namespace, pod, pod_uid, numa_node) ({m(c.CONTAINER_CPUS)} "
            f"* on (node, pod_uid, container_id) group_left "
            f"{exclusive})"
        ),
        "pod_memory": f"sum by (node, namespace, pod, pod_uid, numa_node) ({m(c.POD_MEMORY)})",
        # what each NUMA zone can still give
        "zone_free_cpus": f"{m(c.ZONE_CPUS_ALLOCATABLE)} - {m(c.ZONE_CPUS_ALLOCATED)}",
        "zone_free_devices": m(c.ZONE_DEVICES_FREE),
        "zone_free_memory": m(c.NUMA_MEMORY_FREE),
        # LLC: each pod's share of each L3 domain
        "llc_share": m(c.POD_LLC_SHARE),
        "llc_age": f"time() - timestamp({m(c.POD_LLC_SHARE)})",
        # freshness: which exporter target speaks for each node and is up now, when
        # each node's collectors last succeeded, and whether they do now
        "targets_up": f"{m(c.BUILD_INFO)} and on (job, instance) ({selected('up', selector)} == 1)",
        "collector_age": f"time() - {m(c.COLLECTOR_LAST_SUCCESS)}",
        "collector_success": m(c.COLLECTOR_SUCCESS),
    }


# Labels a row of each answer must carry to be used; a row without one is dropped (and
# counted), never the answer. Empty labels are absent in Prometheus: mig_uuid is optional.
REQUIRED_LABELS: dict[str, tuple[str, ...]] = {
    "cross_numa_sustained": ("node", "instance", "namespace", "pod", "pod_uid", "reason"),
    "cross_numa_seen": ("node", "instance", "namespace", "pod", "pod_uid", "reason"),
    "starved_sustained": ("node", "instance", "namespace", "pod", "pod_uid", "reason", "gpu_uuid"),
    "starved_seen": ("node", "instance", "namespace", "pod", "pod_uid", "reason", "gpu_uuid"),
    "cross_numa_age": ("node", "instance", "pod_uid", "reason"),
    "starved_age": ("node", "instance", "pod_uid", "reason", "gpu_uuid"),
    "slice_sm": ("node", "instance", "mig_uuid", "mig_profile"),
    "slice_sm_peak": ("node", "mig_uuid"),
    "slice_memory_peak": ("node", "mig_uuid"),
    "slice_memory_total": ("node", "mig_uuid"),
    "slice_age": ("node", "instance", "mig_uuid"),
    "holders": ("node", "pod_uid", "resource", "gpu_uuid", "source"),
    "pod_exclusive_cpus": ("node", "pod_uid", "numa_node"),
    "pod_memory": ("node", "pod_uid", "numa_node"),
    # a zone without numa_node is a device on several NUMA nodes: no aligned room
    "zone_free_cpus": ("node",),
    "zone_free_devices": ("node", "resource"),
    "zone_free_memory": ("node",),
    "llc_share": ("node", "instance", "l3_domain", "pod_uid"),
    "llc_age": ("node", "instance", "l3_domain", "pod_uid"),
    "targets_up": ("node", "instance"),
    "collector_age": ("node", "instance", "collector"),
    "collector_success": ("node", "instance", "collector"),
}

# What verification reads for an action of each finding kind: the metric of its verdict.
VERIFIED_BY = {
    "cross_numa": c.POD_CROSS_NUMA,
    "starved": c.GPU_STARVED,
    "noisy_neighbour": c.POD_LLC_SHARE,
    "oversized": c.GPU_HOLDER,
    "undersized": c.GPU_HOLDER,
}


def verification_expressions(
    kind: str, pod_uids: list[str], period: str, selector: str = DEFAULT_SELECTOR
) -> dict[str, str]:
    """The replacement pods' verdicts over the verification period, per pod (and
    resource, for a resize), only for series that already existed at the period's start:
    ``held_throughout``, the highest of each series' lowest value (1: some reason held at
    every scrape), and ``peak``, the highest value of any; and ``age``, of each pod's
    newest sample. Asked only for pending actions' replacements, by uid: the answer
    follows the actions, not the cluster."""
    if not all(_UID.fullmatch(u) for u in pod_uids):
        raise ValueError(f"not pod uids: {pod_uids!r}")
    uids = "|".join(sorted(pod_uids))
    matchers = [f'pod_uid=~"{uids}"']
    by = "node, instance, pod_uid"
    if kind in ("oversized", "undersized"):
        matchers.append('source="kubelet"')
        by += ", resource"
    series = selected(VERIFIED_BY[kind].name, selector, *matchers)
    existed = f"max by ({by}) ({series} offset {period})"
    return {
        "held_throughout": (
            f"max by ({by}) (min_over_time({series}[{period}])) and on ({by}) {existed}"
        ),
        "peak": f"max by ({by}) (max_over_time({series}[{period}])) and on ({by}) {existed}",
        "age": f"min by ({by}) (time() - timestamp({series}))",
    }

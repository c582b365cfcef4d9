"""The PromQL the remediator evaluates each cycle, in rounds sized by what it found.

Round one finds: the sustained verdicts (from the recording rules when Prometheus runs
them as we would write them) and, every few cycles, the slices whose sizing window says
too small or too large. Every later round asks only about what the earlier ones named —
the finding pods (``pod_uid=~``), their slices, their nodes, and the few NUMA zones that
could take them — in bounded batches, so the answers grow with the findings, not with
the cluster. ``expressions`` is the whole set unscoped: the alert rules use it.

The detection expressions are written here once; the alerting rules in ``alerts/`` are
built from the same strings, so that an alert and a remediation can never disagree about
what a finding is. Metric names come from the exporter's catalogue only, and every
selector carries the exporters' own selector (``job="numaguard"`` by default): a series
another scrape target serves is never read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from numaguard.contract import catalogue as c
from numaguard.contract.reasons import (
    JOINED_LEVELS,
    L3_SPAN,
    LINK_TRAFFIC_BYTES_PER_SECOND,
    NO_P2P,
    SIBLING_BUSY_RATIO,
    SMT_SHARED,
)
from numaguard.remediator.core.kinds import (
    CORE_ISOLATION,
    CROSS_NUMA,
    GPU_FRAGMENTATION,
    GPU_LINK,
    KINDS,
    PLACEMENT,
    RESIZED,
    STARVED,
)
from numaguard.remediator.core.needs import Need, set_size
from numaguard.remediator.core.validation import FORBID_EXTRA, Duration

EXPORTER_JOB = "numaguard"  # the exporters' scrape job, as deploy/'s ServiceMonitor names it
DEFAULT_SELECTOR = f'job="{EXPORTER_JOB}"'
_UID = re.compile(r"[0-9A-Za-z-]{1,64}")  # what the API server gives a pod, and no regex
# node names (DNS subdomains), pod uids, MIG uuids (MIG-<uuid> or MIG-GPU-<uuid>/gi/ci):
# nothing a regex would read as anything but itself, once dots are escaped
_NAME = re.compile(r"[0-9A-Za-z][0-9A-Za-z._/-]{0,252}")
BATCH = 200  # names per =~ matcher: a query of some 10 kB at most
# the labels the rounds select series by: a row whose value of one is no name is dropped
# when decoded (signals.frame), so no answer can make a later round's query unwritable
MATCHED = ("node", "pod_uid", "gpu_uuid", "mig_uuid")


def quotable(value: str) -> bool:
    """Whether ``value`` is a name a matcher can select by (see _NAME)."""
    return _NAME.fullmatch(value) is not None


# The recording rules alerts/ installs for the costliest detection expressions: read
# instead of evaluated when Prometheus runs them as the remediator would write them.
RECORDED = {
    CROSS_NUMA.sustained: "numaguard:pod_cross_numa:sustained",
    STARVED.sustained: "numaguard:gpu_starved:sustained",
    "slice_sm": "numaguard:mig_sm_utilization:avg",
}
# The record saying which clusters' servers evaluate the records above, in their group: a
# view of several clusters (Thanos, Mimir) lists every cluster's rules, so the rules being
# there says nothing about this cluster's records; without this one's, none is read.
RULES_EVALUATED = "numaguard:recording:evaluated"


def rules_evaluated(selector: str = DEFAULT_SELECTOR) -> str:
    return f"group by (cluster) ({selected('up', selector)})"


@dataclass(frozen=True)
class Windows:
    """How long a condition must hold before it is a finding (and be gone to clear)."""

    __pydantic_config__ = FORBID_EXTRA

    finding: Duration = "10m"
    sizing: Duration = "1h"
    # the slices to size are looked for every this many cycles (their window is long);
    # those found are followed every cycle
    sizing_every_cycles: Annotated[int, Field(gt=0, strict=True)] = 10


def selected(metric: str, selector: str, *matchers: str) -> str:
    """``metric{selector,matchers...}``: the exporters' series of that metric only."""
    inside = ",".join(m for m in (selector, *matchers) if m)
    return f"{metric}{{{inside}}}" if inside else metric


def expressions(
    w: Windows = Windows(), selector: str = DEFAULT_SELECTOR, scope: str = ""
) -> dict[str, str]:
    """Name -> PromQL, evaluated as instant queries at the cycle's time; ``scope``: a
    matcher every exporter series selected must also meet (``up`` has no such labels,
    nor have a GPU's traffic series: their holders are scoped)."""

    def m(spec: c.MetricSpec, *matchers: str) -> str:
        return selected(spec.name, selector, scope, *matchers)

    cross, starved = m(c.POD_CROSS_NUMA), m(c.GPU_STARVED)
    link, no_p2p = m(c.POD_GPU_LINK_POOR), m(c.POD_GPU_LINK_POOR, f'reason="{NO_P2P}"')
    breaking = m(c.POD_GPU_FRAGMENTING)
    spec_bound = m(c.POD_GPU_LINK_POOR, f'reason!="{NO_P2P}"')
    sm = m(c.MIG_UTILIZATION, 'kind="sm"')
    by_pod = "node, instance, pod_uid"
    # what a pod's full GPUs moved over PCIe over the window, both ways: a pair that
    # moves nothing loses nothing to a poor link (the GPUs' series carry no pod: the
    # scope selects their holders)
    whole_gpus = m(c.GPU_HOLDER, 'mig_uuid=""')
    pcie = selected(c.GPU_PCIE.name, selector)
    moving = (
        f"sum by ({by_pod}) (max by ({by_pod}, gpu_uuid) ({whole_gpus})"
        f" * on (node, instance, gpu_uuid) group_left sum by (node, instance, gpu_uuid) "
        f"(avg_over_time({pcie}[{w.finding}]))) > {LINK_TRAFFIC_BYTES_PER_SECOND!r}"
    )

    def held(verdict: str) -> str:
        return f"min_over_time({verdict}[{w.finding}]) == 1 and {verdict} offset {w.finding} == 1"

    no_p2p_moving = (
        f"{held(no_p2p)} and on ({by_pod}) ({moving}) unless on ({by_pod}) ({spec_bound} == 1)"
    )
    # a core shared with another's thread that kept busy over the window
    smt_shared = m(c.POD_CORE_ISOLATION, f'reason="{SMT_SHARED}"')
    sibling_busy = f"avg_over_time({m(c.POD_SMT_SIBLING_BUSY)}[{w.finding}])"
    smt_shared_busy = (
        f"{held(smt_shared)} and on ({by_pod}) ({sibling_busy} > {SIBLING_BUSY_RATIO!r})"
    )
    isolation = m(c.POD_CORE_ISOLATION)
    l3_span = m(c.POD_CORE_ISOLATION, f'reason="{L3_SPAN}"')
    return {
        # a verdict that held at every scrape of the window and at the last one before
        # it (a new series is not yet sustained) opens a finding. The sample at the
        # window's start is the offset's: Prometheus 3's ranges leave it out, 2's take
        # it in, and the two then agree ...
        CROSS_NUMA.sustained: (
            f"min_over_time({cross}[{w.finding}]) == 1 and {cross} offset {w.finding} == 1"
        ),
        # ... and one that held at any scrape keeps it open (hysteresis)
        CROSS_NUMA.seen: f"max_over_time({cross}[{w.finding}]) == 1",
        STARVED.sustained: (
            f"min_over_time({starved}[{w.finding}]) == 1 and {starved} offset {w.finding} == 1"
        ),
        STARVED.seen: f"max_over_time({starved}[{w.finding}]) == 1",
        # no P2P is a finding only while the pod moves data, and not where its spec keeps
        # its GPUs apart anyway (split, or slices: their own reasons say what to change)
        "no_p2p_moving": no_p2p_moving,
        "smt_shared_busy": smt_shared_busy,
        GPU_LINK.sustained: f"({held(spec_bound)}) or ({no_p2p_moving})",
        GPU_LINK.seen: f"max_over_time({link}[{w.finding}]) == 1",
        # a shared core is a finding only while the thread beside it kept busy
        CORE_ISOLATION.sustained: f"({smt_shared_busy}) or ({held(l3_span)})",
        CORE_ISOLATION.seen: f"max_over_time({isolation}[{w.finding}]) == 1",
        GPU_FRAGMENTATION.sustained: held(breaking),
        GPU_FRAGMENTATION.seen: f"max_over_time({breaking}[{w.finding}]) == 1",
        # how old the newest sample saying so is: an action needs the verdict now
        CROSS_NUMA.age: f"time() - timestamp({cross} == 1)",
        STARVED.age: f"time() - timestamp({starved} == 1)",
        GPU_LINK.age: f"time() - timestamp({link} == 1)",
        GPU_FRAGMENTATION.age: f"time() - timestamp({breaking} == 1)",
        CORE_ISOLATION.age: f"time() - timestamp({isolation} == 1)",
        # one exporter writes one series per pod and reason (and device): a second, now,
        # with another label or another value, was written by someone else
        CROSS_NUMA.series: f"count by (instance, pod_uid, reason) ({cross})",
        STARVED.series: f"count by (instance, pod_uid, reason, gpu_uuid, mig_uuid) ({starved})",
        GPU_LINK.series: f"count by (instance, pod_uid, reason) ({link})",
        GPU_FRAGMENTATION.series: f"count by (instance, pod_uid, reason) ({breaking})",
        CORE_ISOLATION.series: f"count by (instance, pod_uid, reason) ({isolation})",
        # MIG sizing: what each slice did over the whole sizing window, and what it is
        "slice_sm": f"avg_over_time({sm}[{w.sizing}]) and {sm} offset {w.sizing}",
        "slice_sm_peak": f"max_over_time({sm}[{w.sizing}])",
        "slice_memory_peak": f"max_over_time({m(c.MIG_MEMORY_USED)}[{w.sizing}])",
        "slice_memory_total": m(c.MIG_MEMORY_TOTAL),
        "slice_age": f"time() - timestamp({sm})",
        "holders": m(c.GPU_HOLDER),
        "gpu_models": m(c.GPU_INFO),  # a profile's geometry depends on the GPU's model
        # what a pod holds, per NUMA node: its exclusive CPUs and its memory
        "pod_exclusive_cpus": m(c.POD_EXCLUSIVE_CPUS),
        "pod_memory": f"sum by (node, namespace, pod, pod_uid, numa_node) ({m(c.POD_MEMORY)})",
        # what each NUMA zone can still give
        "zone_free_cpus": f"{m(c.ZONE_CPUS_ALLOCATABLE)} - {m(c.ZONE_CPUS_ALLOCATED)}",
        "zone_free_devices": m(c.ZONE_DEVICES_FREE),
        "zone_free_memory": m(c.NUMA_MEMORY_FREE),
        "zone_gpu_free_sets": m(c.ZONE_GPU_FREE_SET, 'numa_node!=""'),
        # what a zone can give a pod kept to whole cores, or to one L3 cache
        "zone_free_whole_cores": m(c.ZONE_CPUS_FREE_WHOLE_CORES),
        "zone_l3_most_free": m(c.ZONE_L3_MOST_FREE_CPUS),
        # how each node's kubelet hands out CPUs: its policy and options, and CPUs a core
        "cpu_manager": m(c.KUBELET_CPU_MANAGER_INFO),
        "cpu_manager_options": m(c.KUBELET_CPU_MANAGER_OPTION),
        "cpus_per_core": m(c.NODE_CPUS_PER_CORE),
        # how many more slices of a MIG profile each GPU's DRA counters allow
        "mig_profiles_free": f"{m(c.GPU_MIG_PROFILES_FREE)} >= 1",
        # LLC: each pod's share of each L3 domain
        "llc_share": m(c.POD_LLC_SHARE),
        "llc_age": f"time() - timestamp({m(c.POD_LLC_SHARE)})",
        # freshness: which exporter target speaks for each node and is up now, when
        # each node's collectors last succeeded, and whether they do now
        "targets_up": f"{m(c.BUILD_INFO)} and on (job, instance) ({selected('up', selector)} == 1)",
        "collector_age": f"time() - {m(c.COLLECTOR_LAST_SUCCESS)}",
        "collector_success": m(c.COLLECTOR_SUCCESS),
        # the exporters whose memory mover is on (--memory-mover): it moves a pod's
        # memory home in place when the remediator asks
        "mover_age": f"time() - timestamp({m(c.MEMORY_MOVED_BYTES)})",
    }


# Labels a row of each answer must carry to be used; a row without one is dropped (and
# counted), never the answer. Empty labels are absent in Prometheus: mig_uuid is optional.
REQUIRED_LABELS: dict[str, tuple[str, ...]] = {
    CROSS_NUMA.sustained: ("node", "instance", "namespace", "pod", "pod_uid", "reason"),
    CROSS_NUMA.seen: ("node", "instance", "namespace", "pod", "pod_uid", "reason"),
    STARVED.sustained: ("node", "instance", "namespace", "pod", "pod_uid", "reason", "gpu_uuid"),
    STARVED.seen: ("node", "instance", "namespace", "pod", "pod_uid", "reason", "gpu_uuid"),
    CROSS_NUMA.age: ("node", "instance", "pod_uid", "reason"),
    STARVED.age: ("node", "instance", "pod_uid", "reason", "gpu_uuid"),
    CROSS_NUMA.series: ("instance", "pod_uid", "reason"),
    GPU_LINK.sustained: ("node", "instance", "namespace", "pod", "pod_uid", "reason"),
    "no_p2p_moving": ("node", "instance", "namespace", "pod", "pod_uid", "reason"),
    "smt_shared_busy": ("node", "instance", "namespace", "pod", "pod_uid", "reason"),
    GPU_LINK.seen: ("node", "instance", "namespace", "pod", "pod_uid", "reason"),
    GPU_LINK.age: ("node", "instance", "pod_uid", "reason"),
    GPU_LINK.series: ("instance", "pod_uid", "reason"),
    GPU_FRAGMENTATION.sustained: ("node", "instance", "namespace", "pod", "pod_uid", "reason"),
    GPU_FRAGMENTATION.seen: ("node", "instance", "namespace", "pod", "pod_uid", "reason"),
    GPU_FRAGMENTATION.age: ("node", "instance", "pod_uid", "reason"),
    GPU_FRAGMENTATION.series: ("instance", "pod_uid", "reason"),
    CORE_ISOLATION.sustained: ("node", "instance", "namespace", "pod", "pod_uid", "reason"),
    CORE_ISOLATION.seen: ("node", "instance", "namespace", "pod", "pod_uid", "reason"),
    CORE_ISOLATION.age: ("node", "instance", "pod_uid", "reason"),
    CORE_ISOLATION.series: ("instance", "pod_uid", "reason"),
    STARVED.series: ("instance", "pod_uid", "reason", "gpu_uuid"),
    "slice_sm": ("node", "instance", "mig_uuid", "mig_profile"),
    "slice_sm_peak": ("node", "mig_uuid"),
    "slice_memory_peak": ("node", "mig_uuid"),
    "slice_memory_total": ("node", "mig_uuid"),
    "slice_age": ("node", "instance", "mig_uuid"),
    "holders": ("node", "pod_uid", "resource", "gpu_uuid", "source"),
    "gpu_models": ("node", "gpu_uuid", "model"),
    "pod_exclusive_cpus": ("node", "pod_uid", "numa_node"),
    "pod_memory": ("node", "pod_uid", "numa_node"),
    # a zone without numa_node is a device on several NUMA nodes: no aligned room
    "zone_free_cpus": ("node",),
    "zone_free_devices": ("node", "resource"),
    "mig_profiles_free": ("node", "mig_profile"),
    "zone_free_memory": ("node",),
    "zone_gpu_free_sets": ("node", "numa_node", "size", "level"),
    "zone_free_whole_cores": ("node", "instance", "numa_node"),
    "zone_l3_most_free": ("node", "instance", "numa_node"),
    "cpu_manager": ("node", "instance", "policy"),
    "cpu_manager_options": ("node", "instance", "option", "setting"),
    "cpus_per_core": ("node", "instance"),
    "llc_share": ("node", "instance", "l3_domain", "pod_uid"),
    "llc_age": ("node", "instance", "l3_domain", "pod_uid"),
    "targets_up": ("node", "instance"),
    "collector_age": ("node", "instance", "collector"),
    "collector_success": ("node", "instance", "collector"),
    "mover_age": ("node", "instance"),
}

REQUIRED_LABELS["slice_candidates"] = ("node", "instance", "mig_uuid")
REQUIRED_LABELS["zone_candidates"] = ("node", "numa_node")

# What later rounds ask about each kind of thing round one named (the placement kinds'
# own queries are in their records, kinds.py)
SLICES = ("slice_sm", "slice_sm_peak", "slice_memory_peak", "slice_memory_total", "slice_age")
LLC = ("llc_share", "llc_age")
# round three, of the finding pods: what they hold, and how many series say their verdicts
HOLDINGS = (
    "pod_exclusive_cpus",
    "pod_memory",
    "holders",
    *(k.series for k in PLACEMENT),
)
ZONES = ("zone_free_cpus", "zone_free_devices", "zone_free_memory", "zone_gpu_free_sets")
NODE_EVIDENCE = ("targets_up", "collector_age", "collector_success")
# of the nodes where pods' cores are shared or caches spanned, and those that could take
# them: whether the kubelet's options keep a new layout whole, and the room that fits it
ISOLATION = (
    "cpu_manager",
    "cpu_manager_options",
    "cpus_per_core",
    "zone_free_whole_cores",
    "zone_l3_most_free",
)
Queries = list[tuple[str, str]]  # (frame name, PromQL): a name may come in several batches


def is_name(value: str) -> bool:
    """A label value ``matching`` can name."""
    return _NAME.fullmatch(value) is not None


def matching(label: str, values: Iterable[str]) -> list[str]:
    """``label=~"a|b|..."`` matchers naming exactly ``values``, BATCH at a time."""
    names = sorted(set(values))
    bad = [v for v in names if not _NAME.fullmatch(v)]
    if bad:
        raise ValueError(f"not names: {bad[:3]!r}")
    escaped = [v.replace(".", r"\\.") for v in names]
    return [f'{label}=~"{"|".join(escaped[i : i + BATCH])}"' for i in range(0, len(names), BATCH)]


def scoped(
    names: Iterable[str], label: str, values: Iterable[str], w: Windows, selector: str
) -> Queries:
    """The named expressions, over the series whose ``label`` is one of ``values`` only."""
    names, out = list(names), []
    for matcher in matching(label, values):
        e = expressions(w, selector, matcher)
        out += [(name, e[name]) for name in names]
    return out


def detection(
    w: Windows,
    selector: str,
    recorded: frozenset[str] = frozenset(),
    sizing: tuple[float, float, float] | None = None,
) -> Queries:
    """Round one. Per verdict, its recording rule's sustained series when Prometheus runs
    it as written here (``recorded``), else every verdict seen in the window — a
    finding's own and its hysteresis' superset, at two thirds the cost of judging every
    pod's whole window; that is judged in round two, for those pods only.
    With ``sizing`` (low, saturated, memory full): the slices whose window says they are
    too large or too small."""
    e = expressions(w, selector)

    def read(name: str) -> str:
        return selected(RECORDED[name], selector) if name in recorded else e[name]

    # how many exporter targets the selector finds, per cluster: none is a selector that
    # names no exporter (a job relabelled otherwise), said, never read as "nothing to
    # fix"; several clusters are a view (Thanos, Mimir) this selector does not narrow
    out = [("exporter_targets", f"count by (cluster) ({selected('up', selector)})")]
    for kind in PLACEMENT:
        sustained, seen = kind.sustained, kind.seen
        out.append((sustained, read(sustained)) if sustained in recorded else (seen, e[seen]))
    if sizing is not None:
        low, saturated, memory_full = sizing
        sm = f"({read('slice_sm')})"
        used = selected(c.MIG_MEMORY_USED.name, selector)
        total = selected(c.MIG_MEMORY_TOTAL.name, selector)
        # every slice but those in the middle whose memory stayed clear of full
        middle = f"{sm} >= {low!r} < {saturated!r}"
        full = f"max_over_time({used}[{w.sizing}]) >= {memory_full!r} * {total}"
        out.append(
            (
                "slice_candidates",
                f"{sm} unless on (node, instance, mig_uuid) "
                f"({middle} unless on (node, instance, mig_uuid) ({full}))",
            )
        )
    return out


def zone_candidates(
    needs: Iterable[Need],
    k: int,
    collectors: tuple[str, ...],
    stale_after: float,
    selector: str = DEFAULT_SELECTOR,
) -> Queries:
    """The NUMA zones that could take the pods: for each distinct (exclusive CPUs,
    devices, joined GPUs) a pod needs, of the zones with that much room (and a free set
    of that many GPUs joined well enough for P2P) on a node whose exporter is up
    and whose ``collectors`` succeeded within ``stale_after``, the ``k`` with most free
    memory and the ``k`` roomiest (CPUs, then memory) among those with the least memory
    any of those pods needs. With ``k`` one more than the actions a cycle may take, some
    zone that fits a pod is always among them when one exists anywhere: whichever zones
    the cycle's actions take, one of the ``k`` with most memory is left as it was."""
    classes: dict[tuple, float] = {}
    for need in needs:
        key = (need.cpus, tuple(sorted(need.devices.items())), need.joined)
        classes[key] = min(need.memory, classes.get(key, need.memory))

    def m(spec: c.MetricSpec, *matchers: str) -> str:
        return selected(spec.name, selector, *matchers)

    zone = 'numa_node!=""'  # a device on several NUMA nodes is no aligned room
    free_cpus = f"sum by (node, numa_node) ({m(c.ZONE_CPUS_ALLOCATABLE, zone)} - " + (
        f"{m(c.ZONE_CPUS_ALLOCATED, zone)})"
    )
    free_memory = f"sum by (node, numa_node) ({m(c.NUMA_MEMORY_FREE, zone)})"
    which = 'collector=~"' + "|".join(collectors) + '"'
    # a node's target is up when its series are there: a failed scrape marks them stale
    fresh = (
        f"count by (node) (time() - {m(c.COLLECTOR_LAST_SUCCESS, which)} <= {stale_after!r} "
        f"and on (node, instance, collector) {m(c.COLLECTOR_SUCCESS, which)} == 1) "
        f"== {len(collectors)}"
    )
    out = []
    for (cpus, devices, joined), least_memory in sorted(classes.items()):
        room = ""
        for resource, count in devices:
            if not _NAME.fullmatch(resource):
                raise ValueError(f"not a resource name: {resource!r}")
            free = m(c.ZONE_DEVICES_FREE, zone, f'resource="{resource}"')
            room += f" and on (node, numa_node) sum by (node, numa_node) ({free}) >= {count}"
        if joined:
            size, levels = set_size(joined), "|".join(JOINED_LEVELS)
            if size is None:
                continue  # more GPUs than any set reported: no zone can say it has them
            sets = m(c.ZONE_GPU_FREE_SET, zone, f'size="{size}"', f'level=~"{levels}"')
            room += f" and on (node, numa_node) group by (node, numa_node) ({sets})"
        room += f" and on (node) {fresh}"
        out.append(
            (
                "zone_candidates",
                f"topk({k}, {free_memory} and on (node, numa_node) {free_cpus} >= {cpus!r}{room})"
                f" or topk({k}, ({free_cpus} >= {cpus!r}) * 1e12 + on (node, numa_node) "
                f"({free_memory} >= {least_memory!r}){room})",
            )
        )
    return out


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
    if kind in RESIZED:
        matchers.append('source="kubelet"')
        by += ", resource"
    series = selected(KINDS[kind].verified_by.name, selector, *matchers)
    existed = f"max by ({by}) ({series} offset {period})"
    return {
        "held_throughout": (
            f"max by ({by}) (min_over_time({series}[{period}])) and on ({by}) {existed}"
        ),
        "peak": f"max by ({by}) (max_over_time({series}[{period}])) and on ({by}) {existed}",
        "age": f"min by ({by}) (time() - timestamp({series}))",
    }


# What the activity queries answer: per pod, and for its devices, the labels a row needs
ACTIVITY_LABELS: dict[str, tuple[str, ...]] = {
    "activity_gpu": ("node", "instance", "pod_uid", "gpu_uuid"),
    "activity_sms": ("node", "instance", "pod_uid", "mig_uuid", "mig_profile"),
    "activity_cpus": ("node", "instance", "pod_uid", "numa_node"),
    **{
        f"activity_{name}": ("node", "instance", "pod_uid")
        for name in ("remote_memory", "remote_traffic", "cpu_pressure", "memory_pressure")
    },
}
REQUIRED_LABELS.update(ACTIVITY_LABELS)


def activity_expressions(
    pods: Iterable[tuple[str, str]], period: float, selector: str = DEFAULT_SELECTOR
) -> Queries:
    """What ``pods`` ((node, uid) pairs) did over the last ``period`` seconds (outcome.py
    reads the answers): each device's SM activity at the instants the pod held it (a
    subquery of about 30 steps, so that a device's time before the pod got it does not
    count), its slices' SMs and profiles, its exclusive CPUs' NUMA nodes, its mean remote memory
    ratio and remote traffic ratio, and its CPU and memory stall rates (PSI some). The
    devices' series are asked of the pods' nodes only: the answer follows the pods."""
    pods = sorted(set(pods))
    if not all(_UID.fullmatch(uid) for _, uid in pods):
        raise ValueError(f"not pod uids: {pods!r}")
    out: Queries = []
    for i in range(0, len(pods), BATCH):
        batch = pods[i : i + BATCH]
        (uids,) = matching("pod_uid", [uid for _, uid in batch])
        (nodes,) = matching("node", [node for node, _ in batch])
        out += _activity(uids, nodes, period, selector)
    return out


def _activity(uids: str, nodes: str, period: float, selector: str) -> Queries:
    window = f"{int(period)}s"
    span = f"[{window}:{max(1, int(period) // 30)}s]"

    def m(spec: c.MetricSpec, *matchers: str) -> str:
        return selected(spec.name, selector, *matchers)

    device = "node, instance, gpu_uuid"
    on_slices, on_gpus = 'mig_uuid!=""', 'mig_uuid=""'  # a whole GPU's holder has none
    slices = f"group by ({device}, mig_uuid, pod_uid) ({m(c.GPU_HOLDER, uids, on_slices)})"
    gpus = f"group by ({device}, pod_uid) ({m(c.GPU_HOLDER, uids, on_gpus)})"
    sm = 'kind="sm"'
    slice_sm = f"max by ({device}, mig_uuid) ({m(c.MIG_UTILIZATION, nodes, sm)})"
    gpu_sm = f"max by ({device}) ({m(c.GPU_UTILIZATION, nodes, sm)})"
    sizes = f"max by ({device}, mig_uuid, mig_profile) ({m(c.MIG_SMS, nodes)})"
    by_pod = "node, instance, pod_uid"

    def stalls(resource: str) -> str:
        return f"max by ({by_pod}) (rate({m(c.POD_PRESSURE[resource], uids)}[{window}]))"

    return [
        (
            "activity_gpu",
            f"avg_over_time(({slice_sm} * on ({device}, mig_uuid) group_right {slices}){span})"
            f" or avg_over_time(({gpu_sm} * on ({device}) group_right {gpus}){span})",
        ),
        ("activity_sms", f"{sizes} * on ({device}, mig_uuid) group_right (mig_profile) {slices}"),
        ("activity_cpus", f"group by ({by_pod}, numa_node) ({m(c.POD_EXCLUSIVE_CPUS, uids)})"),
        (
            "activity_remote_memory",
            f"max by ({by_pod}) (avg_over_time({m(c.POD_REMOTE_MEMORY, uids)}[{window}]))",
        ),
        (
            "activity_remote_traffic",
            f"max by ({by_pod}) (avg_over_time({m(c.POD_REMOTE_TRAFFIC, uids)}[{window}]))",
        ),
        ("activity_cpu_pressure", stalls("cpu")),
        ("activity_memory_pressure", stalls("memory")),
    ]

"""numaguard's Grafana dashboards, generated from code.

``python -m grafana.dashboards`` (or ``make docs``) writes ``grafana/<uid>.json``; a
test fails when they are stale, when a query does not parse or names an unknown metric,
when a panel has no unit, and when a panel returns no data from a real Prometheus
scraping a simulated GPU node and the remediator.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from numaguard.contract import catalogue as c

HERE = Path(__file__).resolve().parent
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# the exporters' job (several installs, or a job relabelled) and the cluster (Thanos,
# Mimir: an external label), as every exporter query is scoped
SCOPE = 'job=~"$job", cluster=~"$cluster"'
NODE = f'{SCOPE}, node=~"$node"'
POD = f'{NODE}, namespace=~"$namespace", pod=~"$pod"'
REMEDIATOR = 'cluster=~"$cluster"'  # its own job: the cluster alone scopes it


@dataclass(frozen=True)
class Panel:
    title: str
    expr: str
    unit: str  # Grafana unit id: bytes, Bps, percentunit, s, short, watt, celsius
    legend: str = ""
    kind: str = "timeseries"  # timeseries | table | stat
    description: str = ""
    # a table's rows by one label, its columns by another, each cell a third's value
    matrix: tuple[str, str, str] = ()


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    variables: tuple[str, ...]  # of node, namespace, pod (datasource always)
    panels: tuple[Panel, ...]
    tags: tuple[str, ...] = field(default=("numaguard",))


DASHBOARDS = (
    Dashboard(
        "numaguard-node",
        "numaguard / Node NUMA overview",
        "Memory, allocation locality, memory traffic and LLC per NUMA node; what each NUMA "
        "zone can still give.",
        ("node",),
        (
            Panel(
                "Free memory per NUMA node",
                f"{c.NUMA_MEMORY_FREE.name}{{{NODE}}}",
                "bytes",
                "{{node}} numa{{numa_node}}",
            ),
            Panel(
                "Used memory per NUMA node",
                f"{c.NUMA_MEMORY_USED.name}{{{NODE}}}",
                "bytes",
                "{{node}} numa{{numa_node}}",
            ),
            Panel(
                "Allocations that went to another node",
                f"{c.NUMA_REMOTE_ALLOC.name}{{{NODE}}}",
                "percentunit",
                "{{node}} numa{{numa_node}}",
            ),
            Panel(
                "Memory bandwidth per NUMA node",
                f"{c.NUMA_BANDWIDTH.name}{{{NODE}}}",
                "Bps",
                "{{node}} numa{{numa_node}}",
            ),
            Panel(
                "Remote share of memory traffic",
                f"{c.NUMA_REMOTE_TRAFFIC.name}{{{NODE}}}",
                "percentunit",
                "{{node}} numa{{numa_node}}",
            ),
            Panel(
                "LLC occupancy per NUMA node",
                f"{c.NUMA_OCCUPANCY.name}{{{NODE}}}",
                "bytes",
                "{{node}} numa{{numa_node}}",
            ),
            Panel(
                "Free exclusive CPUs per NUMA zone",
                f"numaguard:zone_cpus_free{{{NODE}}}",
                "short",
                "{{node}} numa{{numa_node}}",
            ),
            Panel(
                "Free CPUs in whole cores per NUMA zone",
                f"{c.ZONE_CPUS_FREE_WHOLE_CORES.name}{{{NODE}}}",
                "short",
                "{{node}} numa{{numa_node}}",
                description="What the CPU manager can still give as whole cores (SMT nodes): "
                "a pod kept to whole cores (full-pcpus-only) fits only here.",
            ),
            Panel(
                "The kubelet's CPU manager",
                f"{c.KUBELET_CPU_MANAGER_INFO.name}{{{NODE}}}",
                "short",
                kind="table",
                description="Its policy and reserved CPUs per node, as its config file says "
                "(the exporter's --kubelet-config).",
            ),
            Panel(
                "The kubelet's CPU manager options",
                f"{c.KUBELET_CPU_MANAGER_OPTION.name}{{{NODE}}}",
                "short",
                kind="table",
                description="A row per node, a column per option, as its config file sets "
                "them: full-pcpus-only keeps exclusive CPUs to whole cores (else an odd "
                "count shares one), prefer-align-cpus-by-uncorecache to few L3 caches.",
                matrix=("node", "option", "setting"),
            ),
            Panel(
                "Free devices per NUMA zone",
                f"{c.ZONE_DEVICES_FREE.name}{{{NODE}}}",
                "short",
                "{{node}} numa{{numa_node}} {{resource}}",
            ),
        ),
    ),
    Dashboard(
        "numaguard-pods",
        "numaguard / Pod alignment",
        "Which pods are placed across NUMA nodes and why, where their CPUs and memory sit, "
        "their memory traffic, throttling and stalls.",
        ("node", "namespace", "pod"),
        (
            Panel(
                "Cross-NUMA pods",
                f"{c.POD_CROSS_NUMA.name}{{{POD}}} == 1",
                "short",
                kind="table",
                description="One row per pod and reason.",
            ),
            Panel(
                "Exclusive CPUs not their own down to the core or the cache",
                f"{c.POD_CORE_ISOLATION.name}{{{POD}}} == 1",
                "short",
                kind="table",
                description="One row per pod and reason: smt_shared (a thread beside its "
                "exclusive CPUs is another's), l3_span (more L3 caches than its CPUs need). "
                "The remediator's core_isolation findings; the fix is the kubelet's "
                "full-pcpus-only or prefer-align-cpus-by-uncorecache (node dashboard).",
            ),
            Panel(
                "Exclusive CPUs sharing a core: how busy the other thread is",
                f"{c.POD_SMT_SIBLING_BUSY.name}{{{POD}}} and on (node, namespace, pod, pod_uid) "
                f'{c.POD_CORE_ISOLATION.name}{{{POD}, reason="smt_shared"}} == 1',
                "percentunit",
                "{{namespace}}/{{pod}}",
                description="Pods whose exclusive CPUs share a core (SMT) with a thread not "
                "their own, and the busy share of those threads: an idle sibling does no harm. "
                "Whose they are: numaguard_pod_smt_shared_cpus; whether the node runs "
                "full-pcpus-only: numaguard_kubelet_cpu_manager_option.",
            ),
            Panel(
                "Memory per NUMA node",
                f"{c.POD_MEMORY.name}{{{POD}}}",
                "bytes",
                "{{namespace}}/{{pod}} numa{{numa_node}}",
                description="Of pods holding exclusive CPUs or devices (every pod's with the "
                "exporter's --detail).",
            ),
            Panel(
                "Exclusive CPUs per NUMA node",
                f"{c.POD_EXCLUSIVE_CPUS.name}{{{POD}}}",
                "short",
                "{{namespace}}/{{pod}} numa{{numa_node}}",
                description="The CPU manager's exclusive CPUs; pods in the shared pool have none.",
            ),
            Panel(
                "Memory on NUMA nodes without its CPUs",
                f"{c.POD_REMOTE_MEMORY.name}{{{POD}}}",
                "percentunit",
                "{{namespace}}/{{pod}}",
            ),
            Panel(
                "Memory bandwidth",
                f"{c.POD_BANDWIDTH.name}{{{POD}}}",
                "Bps",
                "{{namespace}}/{{pod}}",
            ),
            Panel(
                "Remote share of memory traffic",
                f"{c.POD_REMOTE_TRAFFIC.name}{{{POD}}}",
                "percentunit",
                "{{namespace}}/{{pod}}",
            ),
            Panel(
                "CPU throttled time per second",
                f"rate({c.POD_THROTTLED_SECONDS.name}{{{POD}}}[$__rate_interval])",
                "s",
                "{{namespace}}/{{pod}}",
                description="Summed over the pod's containers; of pods holding exclusive CPUs "
                "or devices (every pod's with --detail).",
            ),
            Panel(
                "CPU stall time per second (PSI some)",
                f"rate({c.POD_PRESSURE['cpu'].name}{{{POD}}}[$__rate_interval])",
                "s",
                "{{namespace}}/{{pod}}",
                description="Summed over the pod's containers; of pods holding exclusive CPUs "
                "or devices (every pod's with --detail).",
            ),
        ),
    ),
    Dashboard(
        "numaguard-gpus",
        "numaguard / GPUs and MIG slices",
        "Per GPU and per MIG slice: activity (each slice on its own scale and in busy SMs), "
        "memory, power, who holds what, and starvation.",
        ("node", "namespace"),
        (
            Panel(
                "Slice SM activity (of the slice)",
                f'{c.MIG_UTILIZATION.name}{{{NODE}, kind="sm"}}',
                "percentunit",
                "{{node}} gpu{{gpu}} {{mig_profile}} {{mig_uuid}}",
            ),
            Panel(
                "Busy SMs per slice (activity x slice size)",
                f'{c.MIG_UTILIZATION.name}{{{NODE}, kind="sm"}} * on (node, mig_uuid) '
                f"group_left {c.MIG_SMS.name}",
                "short",
                "{{node}} gpu{{gpu}} {{mig_profile}} {{mig_uuid}}",
            ),
            Panel(
                "GPU SM activity",
                f'{c.GPU_UTILIZATION.name}{{{NODE}, kind="sm"}}',
                "percentunit",
                "{{node}} gpu{{gpu}}",
            ),
            Panel(
                "Slice memory in use",
                f"{c.MIG_MEMORY_USED.name}{{{NODE}}} / {c.MIG_MEMORY_TOTAL.name}{{{NODE}}}",
                "percentunit",
                "{{node}} gpu{{gpu}} {{mig_profile}} {{mig_uuid}}",
            ),
            Panel(
                "GPU memory in use",
                f"{c.GPU_MEMORY_USED.name}{{{NODE}}}",
                "bytes",
                "{{node}} gpu{{gpu}}",
            ),
            Panel("GPU power", f"{c.GPU_POWER.name}{{{NODE}}}", "watt", "{{node}} gpu{{gpu}}"),
            Panel(
                "GPU temperature",
                f"{c.GPU_TEMPERATURE.name}{{{NODE}}}",
                "celsius",
                "{{node}} gpu{{gpu}}",
            ),
            Panel(
                "Who holds which device",
                f'{c.GPU_HOLDER.name}{{{NODE}, namespace=~"$namespace"}}',
                "short",
                kind="table",
            ),
            Panel(
                "Starved GPUs",
                f'{c.GPU_STARVED.name}{{{NODE}, namespace=~"$namespace"}} == 1',
                "short",
                kind="table",
                description="Devices held back by their pod's host.",
            ),
            Panel(
                "Multi-GPU pods: their worst pair",
                f'{c.POD_GPU_LINK.name}{{{NODE}, namespace=~"$namespace"}}',
                "short",
                kind="table",
                description="How the two worst-joined of a pod's full GPUs reach each other, "
                "as nvidia-smi topo -m names it: nvlink, pix, pxb (NCCL does P2P up to here), "
                "phb, node, sys. The node's whole matrix: numaguard_gpu_link_info, with "
                "--detail.",
            ),
            Panel(
                "Pods whose GPUs cannot reach each other peer to peer",
                f'{c.POD_GPU_LINK_POOR.name}{{{NODE}, namespace=~"$namespace"}} == 1',
                "short",
                kind="table",
                description="no_p2p: joined beyond PXB or P2P refused; split_containers: its "
                "GPUs in different containers; mig_slices: two or more MIG slices.",
            ),
            Panel(
                "PCIe traffic of multi-GPU pods' GPUs",
                f"sum by (node, namespace, pod) (max by (node, gpu_uuid, namespace, pod) "
                f'({c.GPU_HOLDER.name}{{{NODE}, namespace=~"$namespace", mig_uuid=""}}) '
                f"* on (node, gpu_uuid) group_left sum by (node, gpu_uuid) "
                f"({c.GPU_PCIE.name}{{{NODE}}})) and on (node, namespace, pod) "
                f'{c.POD_GPU_LINK.name}{{{NODE}, namespace=~"$namespace"}}',
                "Bps",
                "{{namespace}}/{{pod}}",
                description="Both directions, all its full GPUs: what a pod without P2P "
                "stages through host memory.",
            ),
            Panel(
                "NVLink traffic per GPU",
                f"sum by (node, gpu) ({c.GPU_NVLINK.name}{{{NODE}}})",
                "Bps",
                "{{node}} gpu{{gpu}}",
            ),
            Panel(
                "GPU link matrix, as nvidia-smi topo -m (exporter --detail; one node)",
                f"{c.GPU_LINK.name}{{{NODE}}}",
                "short",
                kind="table",
                description="How each GPU (row) reaches each GPU after it (column): nvlink, "
                "pix, pxb, phb, node, sys. Only exporters run with --detail publish the pairs.",
                matrix=("gpu", "peer_gpu", "level"),
            ),
            Panel(
                "Free GPU sets: the best joined set of each size",
                f"{c.ZONE_GPU_FREE_SET.name}{{{NODE}}}",
                "short",
                kind="table",
                description="Per NUMA node (empty: anywhere on the node), the best level a "
                "set of 2, 4 or 8 free GPUs reaches: where a multi-GPU pod could still get "
                "P2P.",
            ),
            Panel(
                "MIG slices that still fit, by profile (DRA counters)",
                f"{c.GPU_MIG_PROFILES_FREE.name}{{{NODE}}}",
                "short",
                "{{node}} {{counter_set}} {{mig_profile}}",
                description="How many more slices of each profile each GPU's DRA counters "
                "allow, placement-exact, as the scheduler allocates them (DynamicMIG).",
            ),
            Panel(
                "DRA counters consumed",
                f'{c.DRA_COUNTER.name}{{{NODE}, state="consumed"}} / on (node, driver, '
                f'counter_set, counter) {c.DRA_COUNTER.name}{{{NODE}, state="capacity"}}',
                "percentunit",
                "{{node}} {{counter_set}} {{counter}}",
            ),
            Panel(
                "Where DRA claims and GPU instances disagree",
                f"{c.DRA_COUNTER_MISMATCH.name}{{{NODE}}}",
                "short",
                kind="table",
                description="Memory slices claimed with no GPU instance on them, or the "
                "reverse; brief while a claim is prepared or released.",
            ),
            Panel(
                "Activity a slice cannot measure (A100: no GPM)",
                f"{c.MIG_UTILIZATION_SUPPORTED.name}{{{NODE}}} == 0 or "
                f"{c.GPU_UTILIZATION_SUPPORTED.name}{{{NODE}}} == 0",
                "short",
                kind="table",
            ),
        ),
    ),
    Dashboard(
        "numaguard-remediation",
        "numaguard / Remediation",
        "What the remediator finds, does, refuses (by guard), whether its fixes hold and what "
        "they gained.",
        (),
        (
            Panel(
                "Open findings by kind",
                f"sum by (kind) ({c.REMEDIATOR_FINDINGS.name}{{{REMEDIATOR}}})",
                "short",
                "{{kind}}",
            ),
            Panel(
                "Unremediable findings",
                f"{c.REMEDIATOR_UNREMEDIABLE.name}{{{REMEDIATOR}}}",
                "short",
                kind="stat",
            ),
            Panel(
                "Pods the kubelet refused, left Failed",
                f"sum({c.REMEDIATOR_REJECTED.name}{{{REMEDIATOR}}}) or vector(0)",
                "short",
                kind="stat",
                description="Pods refused at admission for NUMA alignment "
                "(TopologyAffinityError, SMTAlignmentError) and still there; by workload "
                f"and node: {c.REMEDIATOR_REJECTED.name}, and the AdmissionRejections Events.",
            ),
            Panel(
                "Actions by kind and result (1h)",
                f"sum by (kind, result) "
                f"(increase({c.REMEDIATOR_ACTIONS.name}{{{REMEDIATOR}}}[1h]))",
                "short",
                "{{kind}} {{result}}",
            ),
            Panel(
                "Refusals by guard (1h)",
                f"sum by (guard) (increase({c.REMEDIATOR_REFUSALS.name}{{{REMEDIATOR}}}[1h]))",
                "short",
                "{{guard}}",
            ),
            Panel(
                "Verifications by outcome (1h)",
                f"sum by (outcome) "
                f"(increase({c.REMEDIATOR_VERIFICATIONS.name}{{{REMEDIATOR}}}[1h]))",
                "short",
                "{{outcome}}",
            ),
            Panel(
                "What fixes gained, median by kind (24h)",
                "histogram_quantile(0.5, sum by (kind, le) "
                f"(increase({c.REMEDIATOR_FIX_GAIN.name}_bucket{{{REMEDIATOR}}}[24h])))",
                "short",
                "{{kind}}",
                description="The workload's GPU work after / before each verified fix (or "
                "its share of local memory, without GPU activity): over 1 it got faster. "
                "Fixes under policy.min_fix_gain are verified no_gain; the "
                "RemediationVerified Events give each fix's before and after.",
            ),
            Panel(
                "Cycle duration",
                f"{c.REMEDIATOR_DURATION.name}{{{REMEDIATOR}}}",
                "s",
                "{{instance}}",
            ),
            Panel(
                "Leader",
                f"{c.REMEDIATOR_LEADER.name}{{{REMEDIATOR}}}",
                "short",
                "{{instance}}",
                kind="stat",
            ),
        ),
    ),
    Dashboard(
        "numaguard-health",
        "numaguard / Exporter health",
        "Are the exporters up, and is every collector succeeding in time?",
        ("node",),
        (
            Panel("Exporters up", f"up{{{SCOPE}}}", "short", "{{instance}}"),
            Panel(
                "Collector success",
                f"{c.COLLECTOR_SUCCESS.name}{{{NODE}}}",
                "short",
                "{{node}} {{collector}}",
            ),
            Panel(
                "Collector duration",
                f"{c.COLLECTOR_DURATION.name}{{{NODE}}}",
                "s",
                "{{node}} {{collector}}",
            ),
            Panel(
                "Collector errors per second by reason",
                f"sum by (node, collector, reason) "
                f"(rate({c.COLLECTOR_ERRORS.name}{{{NODE}}}[$__rate_interval]))",
                "short",
                "{{node}} {{collector}} {{reason}}",
            ),
            Panel(
                "Time since last success",
                f"time() - {c.COLLECTOR_LAST_SUCCESS.name}{{{NODE}}}",
                "s",
                "{{node}} {{collector}}",
            ),
            Panel("Versions", f"{c.BUILD_INFO.name}{{{NODE}}}", "short", kind="table"),
        ),
    ),
)


# variable -> (the label, the series it is read from, what that series is scoped by):
# each is chained to those before it, so a namespace lists only the chosen nodes' pods
_VARIABLES = {
    "cluster": ("cluster", c.BUILD_INFO.name, ""),
    "job": ("job", c.BUILD_INFO.name, 'cluster=~"$cluster"'),
    "node": ("node", c.NUMA_NODE_INFO.name, SCOPE),
    "namespace": ("namespace", c.POD_REMOTE_MEMORY.name, f'{SCOPE}, node=~"$node"'),
    "pod": ("pod", c.POD_REMOTE_MEMORY.name, f'{SCOPE}, node=~"$node", namespace=~"$namespace"'),
}


def _variable(name: str) -> dict:
    label, series, scope = _VARIABLES[name]
    query = (
        f"label_values({series}{{{scope}}}, {label})"
        if scope
        else (f"label_values({series}, {label})")
    )
    variable = {
        "name": name,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "refresh": 2,
    }
    if name == "job":  # the exporters' job the alerts and the remediator read
        variable |= {"includeAll": False, "multi": False}
        variable["current"] = {"text": "numaguard", "value": "numaguard"}
    if name == "cluster":  # only where series carry one (Thanos, Mimir); else hidden
        variable["hide"] = 0
    return variable


def _matrix(row: str, column: str, value: str) -> list[dict]:
    options = {"rowField": row, "columnField": column, "valueField": value}
    return [{"id": "groupingToMatrix", "options": {**options, "emptyValue": "empty"}}]


def render(d: Dashboard) -> dict:
    panels = []
    for i, p in enumerate(d.panels):
        panels.append(
            {
                "id": i + 1,
                "type": p.kind,
                "title": p.title,
                "description": p.description,
                "datasource": DATASOURCE,
                "gridPos": {
                    "h": 8,
                    "w": 24 if p.kind == "table" else 12,
                    "x": 0 if p.kind == "table" else (i % 2) * 12,
                    "y": i * 8,
                },
                "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                "options": {},
                **({"transformations": _matrix(*p.matrix)} if p.matrix else {}),
                "targets": [
                    {
                        "refId": "A",
                        "datasource": DATASOURCE,
                        "expr": p.expr,
                        "legendFormat": p.legend,
                        **({"format": "table", "instant": True} if p.kind == "table" else {}),
                    }
                ],
            }
        )
    return {
        "uid": d.uid,
        "title": d.title,
        "description": d.description,
        "tags": list(d.tags),
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                _variable("cluster"),
                *(_variable(v) for v in (() if d.uid == "numaguard-remediation" else ("job",))),
                *(_variable(v) for v in d.variables),
            ]
        },
        "links": [
            {"title": "numaguard", "type": "dashboards", "tags": ["numaguard"], "asDropdown": True}
        ],
        "panels": panels,
    }


def files() -> dict[str, str]:
    return {f"{d.uid}.json": json.dumps(render(d), indent=2) + "\n" for d in DASHBOARDS}


def write() -> None:
    for name, text in files().items():
        (HERE / name).write_text(text)


if __name__ == "__main__":
    write()

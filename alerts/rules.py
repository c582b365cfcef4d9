"""numaguard's Prometheus rules and their runbooks, written once here.

``python -m alerts.rules`` (or ``make docs``) writes ``alerts/numaguard.rules.yml`` and
``docs/runbooks/<Alert>.md``; a test fails when they are stale. The detection conditions
are the remediator's own expressions (numaguard/remediator/core/queries.py), so an alert and a
remediation never disagree about what a finding is.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from numaguard.contract import catalogue as c
from numaguard.remediator.core.findings import Detection
from numaguard.remediator.core.queries import (
    DEFAULT_SELECTOR,
    RULES_EVALUATED,
    Windows,
    expressions,
    rules_evaluated,
    selected,
)

ROOT = Path(__file__).resolve().parent.parent
RULES_FILE = ROOT / "alerts" / "numaguard.rules.yml"
RUNBOOKS = ROOT / "docs" / "runbooks"
RUNBOOK_URL = "https://github.com/numaguard/numaguard/blob/main/docs/runbooks/{}.md"
# The exporters' own series only, as the remediator reads them (the ServiceMonitor's job)
SELECTOR = DEFAULT_SELECTOR
D = Detection()  # the remediator's thresholds: an alert says what it would act on


def e(spec: c.MetricSpec, *matchers: str) -> str:
    """An exporter metric, selected as the remediator selects it."""
    return selected(spec.name, SELECTOR, *matchers)


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str  # critical | warning | info
    summary: str  # may use {{ $labels.x }}
    description: str
    meaning: str  # runbook: what it means
    action: str  # runbook: what to do
    dashboard: str  # uid of the Grafana dashboard to look at (grafana/)


def recording(windows: Windows = Windows()) -> dict[str, str]:
    """Recording rules: name -> expression."""
    q = expressions(windows)
    return {
        # what each NUMA zone can still give, for dashboards and capacity planning
        "numaguard:zone_cpus_free": q["zone_free_cpus"],
        # placement and starvation findings as the remediator sees them
        "numaguard:pod_cross_numa:sustained": q["cross_numa_sustained"],
        "numaguard:gpu_starved:sustained": q["starved_sustained"],
        # per-slice SM activity over the sizing window, normalised to the slice
        "numaguard:mig_sm_utilization:avg": q["slice_sm"],
        # the worst remote-traffic share of any NUMA node, per node
        "numaguard:node_remote_traffic_ratio:max": (
            f"max by (cluster, node) ({e(c.NUMA_REMOTE_TRAFFIC)})"
        ),
        # which clusters' servers evaluate this group: the remediator reads the records
        # above only for a cluster this says evaluates them
        RULES_EVALUATED: rules_evaluated(SELECTOR),
    }


def alerts(windows: Windows = Windows()) -> list[Alert]:
    """Alerting rules. They use the expressions themselves, not the recording rules
    (Prometheus does not order rule groups: an alert must not see a record late)."""
    q = expressions(windows)
    return [
        Alert(
            "NumaguardPodCrossNUMA",
            q["cross_numa_sustained"],
            "0m",
            "info",  # one per pod: a ticket or a dashboard, never a page
            "Pod {{ $labels.namespace }}/{{ $labels.pod }} is placed across NUMA nodes "
            "({{ $labels.reason }})",
            "On node {{ $labels.node }}, pod {{ $labels.namespace }}/{{ $labels.pod }} has been "
            "cross-NUMA for the whole finding window: {{ $labels.reason }}.",
            "The pod's exclusive CPUs span NUMA nodes (cpu_span), much of its memory sits on "
            "nodes none of its CPUs are on (memory_remote), or a GPU it uses hangs off another "
            "NUMA node than its CPUs (device_remote). Every access across the socket link costs "
            "1.5-1.9x the latency of a local one; host-to-device copies can run 3-5x slower.",
            "Check the remediator's Events on the pod: it evicts such pods when some NUMA zone "
            "can take them aligned, and says `no_fit` when none can. Without the remediator, "
            "set the kubelet's Topology Manager policy to `single-numa-node` on GPU nodes and "
            "delete the pod so that its owner recreates it aligned.",
            "numaguard-pods",
        ),
        Alert(
            "NumaguardGPUStarved",
            q["starved_sustained"],
            "0m",
            "info",  # one per pod: a ticket or a dashboard, never a page
            "GPU work of {{ $labels.namespace }}/{{ $labels.pod }} is starved by its host "
            "({{ $labels.reason }})",
            "On node {{ $labels.node }}, GPU {{ $labels.gpu }} (slice {{ $labels.mig_uuid }}) "
            "has processes but was barely busy for the whole window while the pod's host side "
            "held it back: {{ $labels.reason }}.",
            "The device sits idle waiting for its feeder: the pod is placed across NUMA nodes "
            "(device_remote, memory_remote, remote_traffic), throttled by its CPU limit "
            "(cpu_throttled), or stalled on CPU or memory (cpu_pressure, memory_pressure).",
            "For placement reasons the remediator moves the pod. For CPU-bound feeders raise "
            "the pod's CPU request/limit or its data-loader workers; the remediator only "
            "recommends that (an Event on the pod).",
            "numaguard-gpus",
        ),
        Alert(
            "NumaguardMIGSliceOversized",
            f"({q['slice_sm']}) < {D.low_utilization:g} "
            f"and on (cluster, node, mig_uuid) {e(c.MIG_PROCESSES)} > 0",
            "0m",
            "info",
            "MIG slice {{ $labels.mig_uuid }} ({{ $labels.mig_profile }}) is nearly idle",
            "On node {{ $labels.node }}, slice {{ $labels.mig_uuid }} of GPU {{ $labels.gpu }} "
            f"({{{{ $labels.mig_profile }}}}) has work on it but under {D.low_utilization:.0%} "
            "SM activity over the "
            "sizing window.",
            "A job holds a larger slice than it uses: other jobs queue for the capacity it "
            "leaves idle.",
            "See the remediator's recommended profile (Event on the pod, or `numaguard-remediator "
            'plan`). Annotate the Deployment `numaguard.io/auto-resize: "true"` to let it '
            "patch the pod template, or change the `nvidia.com/mig-*` request yourself.",
            "numaguard-gpus",
        ),
        Alert(
            "NumaguardMIGSliceUndersized",
            f"({q['slice_sm']}) >= {D.saturated:g} or ({q['slice_memory_peak']}) >= "
            f"{D.memory_full:g} * {e(c.MIG_MEMORY_TOTAL)}",
            "0m",
            "info",
            "MIG slice {{ $labels.mig_uuid }} ({{ $labels.mig_profile }}) is saturated",
            "On node {{ $labels.node }}, slice {{ $labels.mig_uuid }} of GPU {{ $labels.gpu }} "
            f"({{{{ $labels.mig_profile }}}}) ran at {D.saturated:.0%} SM activity or "
            f"{D.memory_full:.0%} of its memory over the sizing window.",
            "The job is limited by its slice: it would run faster on the next larger profile.",
            "Request the next larger `nvidia.com/mig-*` profile (the remediator recommends it), "
            "or annotate the Deployment for automatic resizing.",
            "numaguard-gpus",
        ),
        Alert(
            "NumaguardHighRemoteMemoryTraffic",
            f"max by (cluster, node) ({e(c.NUMA_REMOTE_TRAFFIC)}) > 0.5",
            "15m",
            "warning",
            "Node {{ $labels.node }} sends most of its memory traffic across sockets",
            "More than half of the memory traffic of some NUMA node of {{ $labels.node }} has "
            "gone to remote memory for 15 minutes (resctrl).",
            "Workloads on this node read and write memory attached to the other socket: every "
            "such access pays the socket-link latency and bandwidth.",
            "Look at `numaguard_pod_remote_traffic_ratio` for the pods responsible; check their "
            "cpusets and memory placement (`numaguard_pod_memory_bytes` by NUMA node).",
            "numaguard-node",
        ),
        Alert(
            "NumaguardLLCNoisyNeighbour",
            f"max by (cluster, node, l3_domain, namespace, pod) ({e(c.POD_LLC_SHARE)}) >= "
            f"{D.llc_dominant_share:g} and on (cluster, node) "
            f"max by (cluster, node) ({e(c.GPU_STARVED)}) == 1",
            "10m",
            "warning",
            "Pod {{ $labels.namespace }}/{{ $labels.pod }} holds most of an L3 cache next to a "
            "starved GPU",
            "On node {{ $labels.node }}, {{ $labels.namespace }}/{{ $labels.pod }} occupies at "
            "least half of L3 domain {{ $labels.l3_domain }} while a GPU on the node is starved.",
            "A cache-hungry neighbour evicts the GPU feeder's working set from the shared last "
            "level cache.",
            "The remediator evicts such a neighbour when it has lower priority than the starved "
            "pod. Otherwise give the feeder its own L3 domain (CPU manager, or resctrl "
            "allocation) or move the neighbour.",
            "numaguard-node",
        ),
        Alert(
            "NumaguardDRAClaimsAndGPUInstancesDisagree",
            f"{e(c.DRA_COUNTER_MISMATCH)} > 0",
            "15m",
            "warning",
            "GPU {{ $labels.gpu_uuid }}: DRA claims and MIG instances disagree "
            "({{ $labels.kind }})",
            "On node {{ $labels.node }}, memory slices of GPU {{ $labels.gpu_uuid }} "
            "({{ $labels.counter_set }}) have been {{ $labels.kind }} for 15 minutes.",
            "claimed_without_instance: the scheduler allocated a MIG device whose slice the DRA "
            "driver never made (its kubelet plugin failing to prepare the claim: the pod stays "
            "ContainerCreating) or lost. instance_without_claim: a GPU instance no allocated "
            "claim accounts for (made by hand or by the MIG manager on a GPU the driver "
            "partitions dynamically, or left behind by a failed unprepare): the scheduler "
            "counts those memory slices free and will allocate over them.",
            "Check the DRA driver's kubelet plugin logs on the node and `nvidia-smi mig -lgi`. "
            "Destroy instances no claim holds (once no process runs on them), or restart the "
            "plugin so that it prepares the claims again.",
            "numaguard-gpus",
        ),
        Alert(
            "NumaguardMultiGPUPodWithoutP2P",
            q["no_p2p_moving"],
            "0m",
            "warning",
            "{{ $labels.namespace }}/{{ $labels.pod }}: its GPUs move data without P2P",
            "For the whole finding window pod {{ $labels.namespace }}/{{ $labels.pod }} on "
            "{{ $labels.node }} has moved over 1 GB/s over PCIe, on average, through GPUs that "
            "cannot reach each other peer to peer (joined beyond PXB, or P2P refused).",
            "NCCL uses P2P only up to PXB by default (NCCL_P2P_LEVEL): GPUs joined at PHB, NODE "
            "or SYS stage every transfer through host memory, an order of magnitude below "
            "NVLink or a shared PCIe switch (user measurements: NV12 pair 208 GB/s all-reduce, "
            "with a NODE-only third GPU about 20 GB/s, NVIDIA/nccl-tests#178). The device "
            "plugin's NVLink-aware choice is only a preference under the Topology Manager, and "
            "single-GPU pods taking one GPU of each NVLink pair leave later multi-GPU pods SYS "
            "pairs (NVIDIA/k8s-device-plugin#1193).",
            "`numaguard_pod_gpu_link{pod=...}` names its worst pair and "
            "`numaguard_gpu_link_info` (with `--detail`) the node's matrix, as `nvidia-smi topo "
            "-m` shows it, and `numaguard_zone_gpu_free_set` which NUMA nodes have a free set "
            "joined at PXB or better. The remediator (finding gpu_link) evicts the pod only "
            "where one NUMA node has such a set and room for its CPUs and memory (the Topology "
            "Manager decides NUMA first, the device plugin's preference second), and says "
            "`no_fit` otherwise. Under DRA, add `matchAttribute: "
            "resource.kubernetes.io/pcieRoot` to its claim's constraints.",
            "numaguard-gpus",
        ),
        Alert(
            "NumaguardRMIDsExhausted",
            f"{e(c.RESCTRL_UNMONITORED)} > 0",
            "15m",
            "info",
            "Node {{ $labels.node }} ran out of resctrl monitoring IDs",
            "Some pods on {{ $labels.node }} have no resctrl monitoring group: their memory "
            "traffic and LLC use are unknown (not zero).",
            "The CPU has fewer RMIDs than the node has pods to watch; Guaranteed pods keep "
            "theirs first.",
            "Nothing breaks. If the unmonitored pods matter, move pods off the node or remove "
            "resctrl groups other tools made (`sys/fs/resctrl/mon_groups`).",
            "numaguard-node",
        ),
        Alert(
            "NumaguardExporterDown",
            f"{selected('up', SELECTOR)} == 0",
            "10m",
            # as kube-prometheus-stack's TargetDown, which fires beside it: a ticket, not
            # a page (nothing acts on the node's stale data meanwhile)
            "warning",
            "numaguard exporter {{ $labels.instance }} is down",
            "Prometheus has not been able to scrape {{ $labels.instance }} for 10 minutes.",
            "No placement, GPU or traffic data comes from that node; the remediator takes no "
            "action there (its data is stale).",
            "Check the DaemonSet pod on that node (`kubectl -n numaguard get pods -o wide`), "
            "its logs, and that /metrics answers on port 9847.",
            "numaguard-health",
        ),
        Alert(
            "NumaguardCollectorFailing",
            f"{e(c.COLLECTOR_SUCCESS)} == 0",
            "10m",
            "warning",
            "Collector {{ $labels.collector }} fails on {{ $labels.node }}",
            "The {{ $labels.collector }} collector on {{ $labels.node }} has not finished a "
            "cycle cleanly for 10 minutes.",
            "Part of the node's data is missing or doubtful; the remediator does not act on "
            "that node.",
            "See `numaguard_collector_errors_total{collector=...}` for the reason (missing, "
            "permission, parse, timeout, gpu_lost, nvml, kubelet, ...) and the exporter's log "
            "line for the file or call. `driver` on the gpu collector: a GPU node where NVML "
            "cannot be loaded in the exporter's pod (no `nvidia` RuntimeClass or CDI "
            "injection, or the GPU Operator's driver not up yet).",
            "numaguard-health",
        ),
        Alert(
            "NumaguardExporterStale",
            f"time() - {e(c.COLLECTOR_LAST_SUCCESS)} > 300",
            "5m",
            "warning",
            "numaguard data from {{ $labels.node }} is stale",
            "The {{ $labels.collector }} collector on {{ $labels.node }} last succeeded more than "
            "5 minutes ago.",
            "The exporter answers but its data does not move: a hung source (NVML, kubelet, "
            "cgroupfs) or a stuck collection loop.",
            "Check `/healthz` of the exporter and its log for `timeout`; restart the pod if the "
            "collection loop is stuck.",
            "numaguard-health",
        ),
        Alert(
            "NumaguardRemediatorNoLeader",
            # per install (its job, and cluster or any label every replica shares), and only
            # where a remediator runs: an exporters-only install has no such series
            f"max without (instance, pod, container, endpoint) ({c.REMEDIATOR_LEADER.name}) < 1",
            "10m",
            "warning",
            "No numaguard remediator replica leads ({{ $labels.job }})",
            "For 10 minutes no replica of {{ $labels.job }} has held the leader Lease.",
            "Nothing is remediated: findings pile up.",
            "Check the remediator Deployment, its RBAC for leases, and its logs.",
            "numaguard-remediation",
        ),
        Alert(
            "NumaguardRemediationActionsFailing",
            f'increase({c.REMEDIATOR_ACTIONS.name}{{result=~"failed|not_leader"}}[30m]) > 3',
            "0m",
            "warning",
            "numaguard remediation actions fail ({{ $labels.kind }})",
            "More than 3 {{ $labels.kind }} actions failed in 30 minutes.",
            "The API server refuses the remediator's writes (RBAC, admission webhooks, 5xx).",
            "Read the remediator's Warning Events and logs; check its RBAC and any admission "
            "policy on evictions and Deployment patches.",
            "numaguard-remediation",
        ),
        Alert(
            "NumaguardExclusiveCPUsShareABusyCore",
            q["smt_shared_busy"],
            "0m",
            "info",  # one per pod: a ticket or a dashboard, never a page
            "{{ $labels.namespace }}/{{ $labels.pod }}: its exclusive CPUs share a busy core",
            "For the whole finding window a thread on a core of pod {{ $labels.namespace }}/"
            "{{ $labels.pod }}'s exclusive CPUs on {{ $labels.node }} was not its own, and was "
            "busy over half the time on average.",
            "Two hyperthreads of a core share its L1 and L2 caches and execution units: the "
            "pod's CPUs are exclusive in name only. The kubelet's static CPU manager without "
            "`full-pcpus-only` gives a container an odd CPU count on an SMT node as whole cores "
            "and one thread, whose sibling stays in the shared pool or becomes another "
            "container's exclusive CPU (KEP-2625).",
            "`numaguard_pod_smt_shared_cpus{pod=...}` says whose the sibling is (exclusive, "
            "shared_pool, reserved) and `numaguard_kubelet_cpu_manager_option` whether the "
            "node runs `full-pcpus-only` (deploy/components/kubelet-config mounts the file "
            "it is read from). Without it, set `cpuManagerPolicyOptions: {full-pcpus-only: "
            '"true"}` (GA since 1.33; changing CPU manager options needs the node drained and '
            "`cpu_manager_state` removed), after which a pod asking an odd count on an SMT node "
            "is refused with SMTAlignmentError: ask for whole cores (an even count). Evicting "
            "the pod without the option only repeats the layout. The remediator's "
            "`core_isolation` finding says the same on the pod (an Event), and on a node that "
            "runs the option evicts it to a zone with its CPUs free in whole cores.",
            "numaguard-pods",
        ),
        Alert(
            "NumaguardRemediationNotHolding",
            # no_gain is an expected outcome (placement was not what held the job back),
            # said in the RemediationVerified Event and the fix-gain histogram: no alert
            f"increase({c.REMEDIATOR_VERIFICATIONS.name}"
            '{outcome=~"did_not_hold|unverified|gave_up"}[1h]) > 0',
            "0m",
            "warning",
            "numaguard fixes do not hold",
            "In the last hour a remediated workload came back with the same finding, or "
            "could not be verified ({{ $labels.outcome }}).",
            "did_not_hold: the replacement pod was placed as badly as before, typically on a "
            "node whose Topology Manager policy is `none` or `best-effort`, or by a scheduler "
            "that keeps choosing the same node. unverified: no fresh data on the replacement "
            "by the deadline. gave_up: the remediator stopped trying that workload. (no_gain, "
            "an aligned replacement no busier than before, is expected now and then and does "
            "not alert: placement was not what held the job back.)",
            "Set `single-numa-node` on GPU nodes; read the `RemediationVerified` Events (they "
            "give the GPU activity before and after) and "
            "`numaguard_remediator_fix_gain_ratio`. The remediator backs off and gives up on "
            "such workloads by itself.",
            "numaguard-remediation",
        ),
        Alert(
            "NumaguardAdmissionRejections",
            f"{c.REMEDIATOR_REJECTED.name} >= 5",
            "10m",
            "warning",
            "{{ $labels.workload }}: pods refused by the kubelet on {{ $labels.node }}",
            "For 10 minutes at least 5 pods of {{ $labels.workload }} have been left Failed "
            "on {{ $labels.node }} ({{ $labels.reason }}).",
            "The node's Topology Manager (or CPU manager) cannot give the pod its CPUs, memory "
            "and devices on one NUMA node, and the NUMA-blind scheduler keeps sending its "
            "replacements back there: each fails at admission and stays. The remediator deletes "
            "all but the newest few when it acts.",
            "Read the `AdmissionRejections` Event on the workload: it names a node with room "
            "for the pod aligned, if one has it. Steer the workload there (node affinity, "
            "the scheduler's NodeResourceTopology plugin), free room on one NUMA node of this "
            "node, or lower the pod's requests so they fit one.",
            "numaguard-remediation",
        ),
        Alert(
            "NumaguardMIGRelayoutStuck",
            f'{c.REMEDIATOR_MIG_RELAYOUTS.name}{{phase=~"failed|wedged"}} > 0',
            "5m",
            "warning",
            "A MIG re-layout is {{ $labels.phase }}: its node stays cordoned",
            "For 5 minutes a node the remediator re-laid out through the GPU Operator's MIG "
            "manager has been left cordoned ({{ $labels.phase }}), and no other node will "
            "be re-laid out until a person clears it.",
            "failed: the MIG manager could not apply the config, most often because a process "
            "outside any pod still used a slice it had to destroy (NVML_ERROR_IN_USE). "
            "wedged: the state stayed pending past the timeout, as when the manager waits "
            "for GPU clients that never stop (gpu-operator#2833).",
            "`kubectl get nodes -l nvidia.com/mig.config.state` and the `MigRelayout` "
            "Warning Event on the node say which; read the nvidia-mig-manager pod's log "
            "there, fix it, then uncordon the node and remove its "
            "`numaguard.io/mig-relayout` annotation.",
            "numaguard-remediation",
        ),
        Alert(
            "NumaguardUnremediableFindingsPiling",
            f"{c.REMEDIATOR_UNREMEDIABLE.name} > 5",
            "30m",
            "info",
            "Cross-NUMA findings with nowhere to go",
            "For 30 minutes more than 5 findings could not be fixed: no NUMA zone in the "
            "cluster can take those pods aligned.",
            "The cluster lacks aligned capacity (free exclusive CPUs, memory and devices on one "
            "NUMA node).",
            "Look at `numaguard_zone_*` per node; add capacity, defragment, or lower the pods' "
            "requests.",
            "numaguard-remediation",
        ),
    ]


RECORDING = recording()
ALERTS = alerts()


def rules_document(windows: Windows = Windows()) -> dict:
    return {
        "groups": [
            {
                "name": "numaguard.recording",
                "rules": [
                    {"record": name, "expr": expr} for name, expr in recording(windows).items()
                ],
            },
            {
                "name": "numaguard.alerts",
                "rules": [
                    {
                        "alert": a.name,
                        "expr": a.expr,
                        **({"for": a.for_} if a.for_ != "0m" else {}),
                        "labels": {"severity": a.severity},
                        "annotations": {
                            "summary": a.summary,
                            "description": a.description,
                            "runbook_url": RUNBOOK_URL.format(a.name),
                            # the Grafana dashboard to open (grafana/): a link in an
                            # Alertmanager template, or the chart's dashboard_url
                            "dashboard_uid": a.dashboard,
                        },
                    }
                    for a in alerts(windows)
                ],
            },
        ]
    }


def rules_yaml(windows: Windows = Windows()) -> str:
    header = "# Generated by `python -m alerts.rules` (make docs) from alerts/rules.py.\n"
    return header + yaml.safe_dump(rules_document(windows), sort_keys=False, width=1000)


def runbook(a: Alert) -> str:
    return (
        f"# {a.name}\n\nGenerated from alerts/rules.py.\n\n"
        f"Severity: **{a.severity}**. Fires when `{a.expr}`"
        + (f" has held for {a.for_}" if a.for_ != "0m" else "")
        + f".\n\n## What it means\n\n{a.meaning}\n\n## What to do\n\n{a.action}\n\n"
        f"Dashboard: `/d/{a.dashboard}` on your Grafana (grafana/{a.dashboard}.json).\n"
    )


def write() -> None:
    RULES_FILE.write_text(rules_yaml())
    RUNBOOKS.mkdir(parents=True, exist_ok=True)
    for a in ALERTS:
        (RUNBOOKS / f"{a.name}.md").write_text(runbook(a))


if __name__ == "__main__":
    write()
    sys.exit(0)

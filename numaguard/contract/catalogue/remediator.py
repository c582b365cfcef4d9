"""The remediator's own metrics (served by numaguard-remediator, not the exporter)."""

from __future__ import annotations

from numaguard.contract.catalogue.spec import (
    declare,
)

# -- the remediator's own metrics (served by numaguard-remediator, not the exporter) ------
REMEDIATOR_FINDINGS = declare(
    "remediator_findings", "gauge", "Open findings by kind.", ("kind",), "remediator"
)
REMEDIATOR_UNREMEDIABLE = declare(
    "remediator_unremediable_findings",
    "gauge",
    "Open findings no NUMA zone anywhere can take aligned.",
    (),
    "remediator",
)
REMEDIATOR_ACTIONS = declare(
    "remediator_actions_total",
    "counter",
    "Actions carried out, by kind (evict, resize, recommend, delete: a pod the kubelet "
    "refused) and result.",
    ("kind", "result"),
    "remediator",
)
REMEDIATOR_REFUSALS = declare(
    "remediator_refusals_total",
    "counter",
    "Actions refused, by the guard that refused.",
    ("guard",),
    "remediator",
)
REMEDIATOR_VERIFICATIONS = declare(
    "remediator_verifications_total",
    "counter",
    "Fixes checked after the fact, by outcome: held, no_gain (the finding cleared, but the "
    "workload gained less than policy.min_fix_gain), did_not_hold, unverified (no fresh "
    "evidence by the deadline), gave_up.",
    ("outcome",),
    "remediator",
)
REMEDIATOR_LANDINGS = declare(
    "remediator_landings_total",
    "counter",
    "Where evicted pods' replacements were scheduled, judged with their verification: "
    "planned (a node whose zone the plan found to fit), elsewhere_aligned (another node, "
    "and the fix held), elsewhere_misaligned (another node, and it did not).",
    ("outcome",),
    "remediator",
)
REMEDIATOR_FIX_GAIN = declare(
    "remediator_fix_gain_ratio",
    "histogram",
    "What fixes gained, by finding kind: the workload's GPU work (SM activity of its devices, "
    "weighted by their SMs) after / before, over the verification period on either side "
    "of the action; where no GPU activity is measured, its share of local memory after / "
    "before. Over 1: faster. Fixes whose gain could not be measured are not counted.",
    ("kind",),
    "remediator",
    (0.5, 0.8, 0.9, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0),
)
REMEDIATOR_ERRORS = declare(
    "remediator_cycle_errors_total",
    "counter",
    "Cycles that took no action because their data was doubtful, by reason.",
    ("reason",),
    "remediator",
)
REMEDIATOR_DROPPED_ROWS = declare(
    "remediator_dropped_rows_total",
    "counter",
    "Rows of Prometheus answers not used, by reason: missing_label, bad_value (not a "
    "finite, non-negative number), bad_label (a node, pod_uid, gpu_uuid or mig_uuid that "
    "is no name, as no exporter writes it), duplicate (a series answered more than once, "
    "as Prometheus never does: every copy).",
    ("reason",),
    "remediator",
)
REMEDIATOR_REJECTED = declare(
    "remediator_rejected_pods",
    "gauge",
    "A workload's pods the kubelet refused at admission for NUMA alignment and left "
    "Failed, on one node, by reason (TopologyAffinityError, SMTAlignmentError).",
    ("namespace", "workload", "node", "reason"),
    "remediator",
)
REMEDIATOR_MIG_RELAYOUTS = declare(
    "remediator_mig_relayout_nodes",
    "gauge",
    "Nodes in each phase of a MIG re-layout through the GPU Operator's MIG manager "
    "(cordoned, relabelled; failed and wedged are left cordoned for a person).",
    ("phase",),
    "remediator",
)
REMEDIATOR_DURATION = declare(
    "remediator_cycle_duration_seconds", "gauge", "Wall time of the last cycle.", (), "remediator"
)
REMEDIATOR_LEADER = declare(
    "remediator_leader", "gauge", "1 while this replica leads.", (), "remediator"
)
REMEDIATOR_PAUSED = declare(
    "remediator_paused", "gauge", "1 while remediation is paused.", (), "remediator"
)
REMEDIATOR_LAST_SUCCESS = declare(
    "remediator_last_success_timestamp_seconds",
    "gauge",
    "When a remediation cycle last completed.",
    (),
    "remediator",
)

"""The MIG manager mode of the control loop: the slices sizing wants that no node has
free, which of the MIG manager's configs would serve them, and (opt-in) one node at a
time re-laid out to one, its steps written by the actuator (core/relayout.py)."""

from __future__ import annotations

import logging
from dataclasses import replace

from numaguard.contract.names import MIG_CONFIG_LABEL
from numaguard.remediator.actuator import Actuator
from numaguard.remediator.cluster import gpu_pods, mig_configs, mig_nodes
from numaguard.remediator.core import relayout as rl
from numaguard.remediator.core.actions import PodInfo
from numaguard.remediator.core.claims import RESOURCES, mechanism
from numaguard.remediator.core.cycle_report import CycleReport
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.kube import Kube
from numaguard.remediator.metrics import Metrics

log = logging.getLogger(__name__)


async def relayout(
    kube: Kube,
    actuator: Actuator,
    metrics: Metrics,
    said: dict[str, str],
    report: CycleReport,
    pods: dict[str, PodInfo],
    policy: Policy,
    now: float,
) -> None:
    """The slices sizing wants and no node has free: which MIG manager config would
    serve them, and (opt-in) one node at a time re-laid out to one (core/relayout.py).
    ``said``: what was last logged per family or node, carried between cycles."""
    settings = policy.mig_layout
    if settings.mode == "off":
        return
    want: dict[str, int] = {}
    for refusal in report.plan.refusals:
        finding, pod = refusal.finding, pods.get(refusal.finding.pod_uid)
        if refusal.guard != "no_fit" or not finding.recommended or pod is None:
            continue
        how = mechanism(pod.resources, pod.claims, finding.profile)[0]
        if how == RESOURCES and not pod.extended_claim:  # a device plugin's slice
            want[finding.recommended] = want.get(finding.recommended, 0) + 1
    relabel = settings.mode == "relabel" and not policy.paused
    if not want and not relabel:
        return
    selector = settings.node_selector if relabel else MIG_CONFIG_LABEL
    nodes = await mig_nodes(kube, selector, metadata_only=not relabel)
    families = {n.family.name: n.family for n in nodes if n.family is not None}
    report.layouts = rl.recommend(want, list(families.values()))
    for r in report.layouts:
        _say_layout(said, r)
    metrics.relayouts.clear()
    for phase in rl.PHASES:
        metrics.relayouts.labels(phase).set(
            sum(n.relayout is not None and n.relayout.phase == phase for n in nodes)
        )
    if not relabel:
        return
    configs = await mig_configs(kube, settings.config_map, settings.config_key)
    # the pods of the nodes in flight, and of the first few a re-layout may begin on
    read = [n for n in nodes if n.relayout is not None and n.relayout.phase == "cordoned"]
    if want and not any(n.relayout or n.doubt for n in nodes):
        fitting = [n for n in rl.candidates(nodes) if rl.best_config(n, configs, want)[0]]
        read += fitting[: rl.GPU_PODS_READ]
    found = {n.name: await gpu_pods(kube, n.name) for n in read}
    nodes = [replace(n, gpu_pods=found.get(n.name)) for n in nodes]
    versions = {n.name: n.version for n in nodes}
    for step in rl.steps(nodes, want, configs, settings, now):
        text = f"{step.phase}: {step.why}"
        if policy.dry_run and said.get(step.node) == text:
            continue  # a dry run's step is the same each cycle: said once
        said[step.node] = text
        result = await actuator.relayout(step, versions[step.node])
        report.relayouts.append((step, result))
        log.info(
            "MIG re-layout of %s: %s (%s): %s",
            step.node,
            step.phase,
            result,
            step.why,
            extra={
                "decision": "mig_relayout",
                "node": step.node,
                "phase": step.phase,
                "result": result,
                "config": step.relayout.config if step.relayout else "",
                "dry_run": policy.dry_run,
            },
        )


def _say_layout(said: dict[str, str], r: rl.Recommendation) -> None:
    """Log a recommended layout when it changes."""
    text = f"{r.label} for {r.want}"
    if said.get(r.family) == text:
        return
    said[r.family] = text
    log.info(
        "%s: a MIG manager config %s would hold %s of the wanted slices",
        r.family,
        r.label,
        r.want,
        extra={
            "decision": "mig_layout",
            "family": r.family,
            "want": r.want,
            "label": r.label,
            "config": r.config,
        },
    )

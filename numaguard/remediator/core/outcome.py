"""Whether a fix paid off (pure): what a workload's pod did over a window before the
action and its replacement over as long after it, and the gain between the two.

The gain is the workload's GPU work after / before: the SM activity of the devices it
holds, each on its own scale, weighted by the device's SMs (a whole GPU counts one), so
that a job moved between devices alike gains what its activity gained, and one resized
from a 7g to a 1g slice that keeps its 13 busy SMs busy gains 1. Where no GPU activity is
measured (a pod without GPUs, an A100 slice), it is the pod's share of local memory after
/ before, when some of its memory was remote before; otherwise no gain is measured, and
the fix is judged by its finding alone.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from numaguard.remediator.core.validation import FORBID_EXTRA, NonNegative, Text

Measure = NonNegative | None
# Busy SMs under this share of the devices' SMs before the action count as that much,
# and so does a share of local memory: an idle job's gain is large, not infinite.
FLOOR = 0.01
# Some memory must have been remote for moving it local to be a gain to measure.
MIN_REMOTE = 0.05
# The queries (queries.activity_expressions) whose one value per pod is a measure.
MEASURES = ("remote_memory", "remote_traffic", "cpu_pressure", "memory_pressure")


@dataclass(frozen=True)
class Activity:
    """What one pod did over a window; None: not measured."""

    __pydantic_config__ = FORBID_EXTRA

    gpu: Measure = None  # SM activity of its devices, SM-weighted, 0..1
    sms: Measure = None  # the SMs of its devices (a whole GPU counts one)
    node: Text = ""  # where it ran
    numa_nodes: Text = ""  # the NUMA nodes of its exclusive CPUs
    devices: Text = ""  # the profiles of its devices ("gpu": a whole GPU)
    remote_memory: Measure = None  # its memory outside its CPUs' NUMA nodes, 0..1
    remote_traffic: Measure = None  # remote share of its memory traffic (resctrl)
    # time some of a container's tasks stalled on CPU per second, its containers' summed
    cpu_pressure: Measure = None
    memory_pressure: Measure = None  # ... on memory


def activities(signals, pods, instances: dict[str, str]) -> dict[str, Activity]:
    """Per pod uid, what the activity queries answered for ``pods`` ((node, uid) pairs)
    from their node's exporter target (``instances``: node -> target; other targets'
    rows, and rows of the pod on another node, are not read)."""
    node_of = dict((uid, node) for node, uid in pods)

    def rows(name: str) -> list[dict]:
        return [
            r
            for r in signals[name].to_dict("records")
            if node_of.get(r["pod_uid"]) == r["node"] and instances.get(r["node"]) == r["instance"]
        ]

    gpu, sizes, cpus = rows("activity_gpu"), rows("activity_sms"), rows("activity_cpus")
    measures = {name: rows(f"activity_{name}") for name in MEASURES}
    out = {}
    for uid, node in node_of.items():
        found: dict = {"node": node}
        slices = {r["mig_uuid"]: r for r in sizes if r["pod_uid"] == uid}
        work = total = 0.0
        profiles = []
        for r in (r for r in gpu if r["pod_uid"] == uid):
            device = r.get("mig_uuid", "")
            size = slices.get(device) if device else {"value": 1.0, "mig_profile": "gpu"}
            if size is None:
                break  # a slice of unknown size: no weighing it
            work, total = work + r["value"] * size["value"], total + size["value"]
            profiles.append(size["mig_profile"])
        else:
            if total > 0:
                found["gpu"], found["sms"] = min(1.0, work / total), total
                found["devices"] = "+".join(sorted(profiles))
        nodes = {r["numa_node"] for r in cpus if r["pod_uid"] == uid}
        found["numa_nodes"] = ",".join(sorted(nodes, key=lambda n: (len(n), n)))
        for name, answer in measures.items():
            values = [r["value"] for r in answer if r["pod_uid"] == uid]
            if len(values) == 1:
                found[name] = values[0]
        out[uid] = Activity(**found)
    return out


def mean(measured: list[Activity]) -> Activity | None:
    """Several replacements' activity as one: the mean of each measure they have."""
    if len(measured) <= 1:
        return measured[0] if measured else None
    found: dict = {}
    for f in fields(Activity):
        values = [getattr(a, f.name) for a in measured]
        if f.name in ("node", "numa_nodes", "devices"):
            found[f.name] = ";".join(sorted(set(values) - {""}))
        elif any(v is not None for v in values):
            present = [v for v in values if v is not None]
            found[f.name] = sum(present) / len(present)
    return Activity(**found)


@dataclass(frozen=True)
class Gain:
    ratio: float | None  # after / before; None: not measured
    detail: str  # what was compared, for the Event and the log


def gain(before: Activity | None, after: Activity | None) -> Gain:
    if before is None or after is None:
        missing = "before the action" if before is None else "for the replacement"
        return Gain(None, f"gain not measured: no activity recorded {missing}")
    if before.gpu is not None and after.gpu is not None:
        busy_before, busy_after = before.gpu * before.sms, after.gpu * after.sms
        least = FLOOR * before.sms  # on either side: a job idle before and after gained 1
        ratio = max(busy_after, least) / max(busy_before, least)
        text = f"GPU activity {before.gpu:.2f} -> {after.gpu:.2f}"
        if before.devices != after.devices:
            text = (
                f"GPU activity {before.gpu:.2f} on {before.devices} -> {after.gpu:.2f} on "
                f"{after.devices} ({busy_before:.1f} -> {busy_after:.1f} busy SMs)"
            )
        return Gain(ratio, text)
    if (
        before.remote_memory is not None
        and after.remote_memory is not None
        and before.remote_memory >= MIN_REMOTE
    ):
        local_before, local_after = 1 - before.remote_memory, 1 - after.remote_memory
        ratio = local_after / max(local_before, FLOOR)
        return Gain(ratio, f"local memory {local_before:.2f} -> {local_after:.2f}")
    return Gain(None, "gain not measured: no GPU activity, nor remote memory before")


def judged(outcome: str, g: Gain, least: float) -> str:
    """A fix that held but gained less than ``least``: no_gain (it counts like one that
    did not hold). A gain not measured leaves the finding's verdict as it is."""
    if outcome == "held" and g.ratio is not None and g.ratio < least:
        return "no_gain"
    return outcome

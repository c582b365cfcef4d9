"""Findings (pure): what the cycle's signals say is wrong, with hysteresis.

A finding opens when its condition held over the whole window (``*_sustained``) and
stays open while it was seen at all in the window (``*_seen``); it closes only when the
window holds no trace of it. Detection findings compare what a MIG slice did over the
sizing window with the profiles of its GPU's family (mig.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from numaguard.contract.reasons import NO_P2P
from numaguard.remediator.core.answers import Signals
from numaguard.remediator.core.kinds import (
    GPU_FRAGMENTATION,
    GPU_LINK,
    NOISY_NEIGHBOUR,
    OVERSIZED,
    PLACEMENT,
    STARVED,
    UNDERSIZED,
)
from numaguard.remediator.core.mig import family_of, geometry
from numaguard.remediator.core.validation import FORBID_EXTRA, Ratio

GIB = 1 << 30


@dataclass(frozen=True)
class Finding:
    kind: str  # one of kinds.KINDS
    node: str
    namespace: str
    pod: str
    pod_uid: str
    reason: str  # cross_numa: cpu_span | memory_remote | device_remote; starved: its reason
    device: str = ""  # GPU or MIG uuid, for device findings
    profile: str = ""  # the slice's profile, for sizing findings
    recommended: str = ""  # the profile that fits, for sizing findings
    resource: str = ""  # the extended resource it holds
    feeder_uid: str = ""  # noisy_neighbour: the starved pod it crowds out
    feeder: str = ""  # its namespace/name
    instance: str = ""  # the scrape target whose series say so

    @property
    def key(self) -> tuple:
        return (self.kind, self.pod_uid or (self.namespace, self.pod), self.reason, self.device)


@dataclass(frozen=True)
class Detection:
    __pydantic_config__ = FORBID_EXTRA

    low_utilization: Ratio = 0.3  # sustained SM activity below this: could be smaller
    saturated: Ratio = 0.9  # at or above this, or memory nearly full: needs larger
    memory_full: Ratio = 0.95
    headroom: Ratio = 0.25  # kept free in the recommended profile
    llc_dominant_share: Ratio = 0.5  # a pod holding this much of an L3 with a starved
    # GPU feeder on it is a noisy neighbour

    def __post_init__(self) -> None:
        if self.low_utilization >= self.saturated:
            raise ValueError(
                f"low_utilization ({self.low_utilization:g}) must be under saturated "
                f"({self.saturated:g})"
            )


@dataclass
class FindingState:
    """Open findings, carried from cycle to cycle by the control loop."""

    open: dict[tuple, Finding] = field(default_factory=dict)
    opened_at: dict[tuple, float] = field(default_factory=dict)


def update(
    state: FindingState, signals: Signals, detection: Detection = Detection()
) -> FindingState:
    """This cycle's open findings from the last cycle's and the signals."""
    sustained = {f.key: f for f in _placement(signals, "sustained")}
    seen = {f.key for f in _placement(signals, "seen")}
    new = FindingState()
    for key, finding in {**state.open, **sustained}.items():
        if key in sustained or key in seen:
            new.open[key] = sustained.get(key, finding)
            new.opened_at[key] = state.opened_at.get(key, signals.at)
    # a pod breaking a GPU pair matters only while a multi-GPU pod goes without P2P
    if not any(f.kind == GPU_LINK.name and f.reason == NO_P2P for f in new.open.values()):
        for key in [k for k, f in new.open.items() if f.kind == GPU_FRAGMENTATION.name]:
            del new.open[key], new.opened_at[key]
    # neighbours are judged against the starved pods open now
    for finding in noisy_neighbours(signals, new.open.values(), detection):
        new.open[finding.key] = finding
        new.opened_at[finding.key] = state.opened_at.get(finding.key, signals.at)
    # sizing is judged on averages over its own, longer window: no extra hysteresis
    for finding in sizing_findings(signals, detection):
        new.open[finding.key] = finding
        new.opened_at[finding.key] = state.opened_at.get(finding.key, signals.at)
    return new


def _placement(signals: Signals, which: str) -> list[Finding]:
    """``which``: sustained | seen, of each kind the exporter's verdicts find."""
    out = []
    for kind in PLACEMENT:
        for row in _rows(signals[getattr(kind, which)]):
            if row["reason"] not in kind.reasons:
                continue  # no exporter writes it: a forged series, never a finding
            out.append(
                Finding(
                    kind.name,
                    row["node"],
                    row["namespace"],
                    row["pod"],
                    row["pod_uid"],
                    row["reason"],
                    device=row.get("mig_uuid") or row.get("gpu_uuid", ""),
                    instance=row["instance"],
                )
            )
    return out


def noisy_neighbours(signals: Signals, open_findings, detection: Detection) -> list[Finding]:
    """Pods holding most of an L3 domain that a starved GPU's feeder also uses."""
    share = signals["llc_share"]
    starved = {f.pod_uid: f for f in open_findings if f.kind == STARVED.name}
    if share.empty or not starved or "pod_uid" not in share:
        return []
    rows = share.to_dict("records")
    fed = {(r["node"], r["l3_domain"]): r["pod_uid"] for r in rows if r["pod_uid"] in starved}
    out = []
    for r in rows:
        feeder_uid = fed.get((r.get("node", ""), r.get("l3_domain", "")))
        if (
            feeder_uid is None
            or r["pod_uid"] == feeder_uid
            or r["value"] < detection.llc_dominant_share
        ):
            continue
        feeder = starved[feeder_uid]
        out.append(
            Finding(
                NOISY_NEIGHBOUR.name,
                r["node"],
                r.get("namespace", ""),
                r.get("pod", ""),
                r["pod_uid"],
                "llc",
                device=f"l3:{r['l3_domain']}",
                feeder_uid=feeder_uid,
                feeder=f"{feeder.namespace}/{feeder.pod}",
                instance=r["instance"],
            )
        )
    return out


def sizing_findings(signals: Signals, detection: Detection) -> list[Finding]:
    """Slices whose pod would fit a smaller profile, or that are saturated."""
    sm = signals["slice_sm"]
    if sm.empty:
        return []
    key = ["node", "mig_uuid"]
    columns = [*key, "gpu_uuid", "instance", "mig_profile", "value"]
    df = sm.reindex(columns=columns, fill_value="").rename(columns={"value": "sm"})
    for name, column in (
        ("slice_sm_peak", "sm_peak"),
        ("slice_memory_peak", "memory_peak"),
        ("slice_memory_total", "memory_total"),
    ):
        other = signals[name]
        if other.empty:
            return []
        df = df.merge(other[[*key, "value"]].rename(columns={"value": column}), on=key)
    holders = signals["holders"]
    if holders.empty or "mig_uuid" not in holders:
        return []
    columns = ["node", "mig_uuid", "namespace", "pod", "pod_uid", "resource"]
    holders = holders.reindex(columns=columns, fill_value="")
    holders = holders[holders["mig_uuid"] != ""].drop_duplicates(key)
    df = df.merge(holders, on=key)
    gpu = ["node", "gpu_uuid"]
    models = signals["gpu_models"].reindex(columns=[*gpu, "model"], fill_value="")
    df = df.merge(models.drop_duplicates(gpu), on=gpu, how="left").fillna({"model": ""})
    out = []
    for row in df.itertuples(index=False):
        family = family_of(row.model, row.mig_profile)
        if family is None:
            continue  # a GPU or a profile we cannot size: no guess
        sizes = family.sizes(row.mig_profile)
        memory_full = row.memory_peak >= detection.memory_full * row.memory_total
        compute_full = row.sm >= detection.saturated
        if compute_full or memory_full:
            kind = UNDERSIZED.name
            recommended = next_larger(sizes, row.mig_profile, compute_full, memory_full)
        elif row.sm < detection.low_utilization:
            kind = OVERSIZED.name
            recommended = smallest_fit(sizes, row.mig_profile, row.sm, row.memory_peak, detection)
        else:
            continue
        if not recommended or recommended == row.mig_profile:
            continue
        out.append(
            Finding(
                kind,
                row.node,
                row.namespace,
                row.pod,
                row.pod_uid,
                kind,
                device=row.mig_uuid,
                profile=row.mig_profile,
                recommended=recommended,
                resource=row.resource,
                instance=row.instance,
            )
        )
    return out


def smallest_fit(
    sizes: list[str], current: str, sm: float, memory_peak: float, detection: Detection
) -> str:
    """The smallest profile, no larger than ``current`` in compute or memory, whose
    compute and memory cover what the slice used, plus headroom; ``current`` when none
    does (an idle slice whose memory needs all it has is not oversized)."""
    compute, memory = geometry(current)
    need_slices = sm * compute * (1 + detection.headroom)
    need_bytes = memory_peak * (1 + detection.headroom)
    for profile in sizes:
        slices, gb = geometry(profile)
        if slices > compute or gb > memory:
            continue  # not a smaller slice
        if slices >= need_slices and gb * 1e9 >= need_bytes:
            return profile
    return current


def next_larger(sizes: list[str], current: str, more_compute: bool, more_memory: bool) -> str:
    """The smallest profile with more of what ran out and no less of the rest ("": none)."""
    compute, memory = geometry(current)
    for profile in sizes:
        c, m = geometry(profile)
        if c < compute or m < memory or (c, m) == (compute, memory):
            continue
        if (not more_compute or c > compute) and (not more_memory or m > memory):
            return profile
    return ""


def _rows(df: pd.DataFrame):
    if df.empty:
        return []
    return df.to_dict("records")


def shared_pool_advice(f: Finding) -> str:
    """For a placement finding on a pod without exclusive CPUs: no kubelet gives a pod of
    the shared CPU pool a NUMA zone, so no eviction can align it."""
    return (
        "in the shared CPU pool, which no kubelet places on one NUMA node: give it whole "
        "CPUs (Guaranteed QoS, integer CPU requests, the static CPU manager) to have it "
        f"aligned ({f.kind}: {f.reason})"
    )

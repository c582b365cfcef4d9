"""Starvation (pure): a GPU or slice with work on it that was barely busy while its
pod's host side held it back, for each reason of thresholds.STARVED_REASONS."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from numaguard.contract.reasons import STARVED_REASONS
from numaguard.exporter.model.devices import DeviceUse
from numaguard.exporter.model.placement import PodState
from numaguard.exporter.model.thresholds import Thresholds
from numaguard.exporter.model.traffic import ResctrlState


@dataclass(slots=True)
class Starvation:
    """A device with work on it, how busy it was over the last interval, and for each
    host-side reason that could be decided whether it starves it: low utilization while
    that host signal is high."""

    use: DeviceUse
    utilization: float
    verdicts: Mapping[str, bool]


def starvation_of(
    uses: tuple[DeviceUse, ...],
    previous: Iterable[PodState],
    interval: float | None,
    traffic: ResctrlState | None,
    thresholds: Thresholds,
) -> tuple[Starvation, ...]:
    before = {p.uid: p for p in previous}
    out = []
    for use in uses:
        unit = use.mig or use.gpu
        activity = unit.activity.utilization
        utilization = activity.get("sm", activity.get("graphics"))
        pod = use.pod_state
        if not unit.processes or utilization is None or pod is None:
            continue  # nothing running, unmeasured, or a pod we cannot see: no verdict
        low = utilization < thresholds.gpu_starved_utilization
        signals = _host_signals(pod, before.get(pod.uid), interval, traffic)
        verdicts = {}
        for reason in STARVED_REASONS:  # those that can be decided on this cycle's data
            if reason.default is None and reason.name in pod.cross_numa:
                verdicts[reason.name] = low and pod.cross_numa[reason.name]
            elif reason.name in signals:
                verdicts[reason.name] = (
                    low and signals[reason.name] >= thresholds.starved[reason.name]
                )
        out.append(Starvation(use, utilization, verdicts))
    return tuple(out)


def _host_signals(
    pod: PodState, before: PodState | None, interval: float | None, traffic: ResctrlState | None
) -> dict[str, float]:
    """The pod's host-side signals over the last interval, worst container first: share
    of periods throttled, share of time stalled on CPU and on memory (PSI some), share of
    its memory traffic that went remote. Only those the counters allow (a counter that
    went back, a new container, the first cycle: none)."""
    out: dict[str, float] = {}
    earlier = {c.container_id: c for c in before.containers} if before else {}
    for c in pod.containers:
        e = earlier.get(c.container_id)
        if e is None or not interval or interval <= 0:
            continue
        if c.throttling and e.throttling:
            periods = c.throttling.periods - e.throttling.periods
            throttled = c.throttling.throttled_periods - e.throttling.throttled_periods
            if periods > 0 and throttled >= 0:
                out["cpu_throttled"] = max(out.get("cpu_throttled", 0.0), throttled / periods)
        for resource in ("cpu", "memory"):
            now, then = c.pressure.get(resource), e.pressure.get(resource)
            if now and then and now.some_seconds >= then.some_seconds:
                share = (now.some_seconds - then.some_seconds) / interval
                key = f"{resource}_pressure"
                out[key] = max(out.get(key, 0.0), share)
    remote = traffic.pods.get(pod.uid) if traffic else None
    if remote is not None and remote.remote_ratio is not None:
        out["remote_traffic"] = remote.remote_ratio
    return out

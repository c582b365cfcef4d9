"""A workload's history (pure): what numaguard did to it and how it went, kept as an
annotation on the workload so that a restarted or new leader keeps every guard; the
schema is closed (``from_json`` reads only what ``to_json`` writes: known kinds and
reasons, a bounded number of entries and bytes)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StringConstraints, TypeAdapter, ValidationError

from numaguard.remediator.core.findings import Finding
from numaguard.remediator.core.kinds import KINDS, MIGRATE_MEMORY, NOISY_NEIGHBOUR, RESIZED
from numaguard.remediator.core.outcome import Activity, Gain
from numaguard.remediator.core.reach import NODES_PER_FINDING
from numaguard.remediator.core.validation import FORBID_EXTRA, Count, Seconds

# A history is written by the remediator and may be rewritten by whoever can patch the
# workload: its size is bounded, so that no tenant can make verifying it costly. The
# remediator itself writes at most policy.max_per_workload pending entries.
MAX_PENDING = 8
MAX_HISTORY_BYTES = 8192
Name = Annotated[str, StringConstraints(max_length=253, strict=True)]
NodeName = Annotated[
    str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", strict=True)
]
# the result of each action that was taken (the others: refused, failed...)
DONE = {"evict": "evicted", "resize": "resized", MIGRATE_MEMORY: "requested"}
# where a replacement was scheduled, against where the plan said (landing())
LANDINGS = ("planned", "elsewhere_aligned", "elsewhere_misaligned")


@dataclass(frozen=True)
class Pending:
    """An action waiting to be verified."""

    __pydantic_config__ = FORBID_EXTRA

    kind: Literal[tuple(KINDS)]  # the finding's kind
    reason: Name  # one of its kind's reasons
    at: Seconds
    pod_uid: Name  # the pod acted on; its replacements have other uids
    recommended: Name = ""  # a resize's new profile
    # whose activity tells whether the fix paid off (the pod acted on, or the feeder a
    # noisy neighbour crowded out), and what it did before the action
    measured_uid: Name = ""
    before: Activity | None = None
    # an eviction's: the nodes whose zones the plan found to fit, roomiest first
    nodes: Annotated[tuple[NodeName, ...], Field(max_length=NODES_PER_FINDING)] = ()
    # the fix kept the pod (its memory moved home): judged on the pod itself
    in_place: StrictBool = False

    def __post_init__(self) -> None:
        if self.reason not in KINDS[self.kind].reasons:
            raise ValueError(f"{self.kind} has no reason {self.reason!r}")


@dataclass(frozen=True)
class WorkloadHistory:
    """What numaguard did to a workload and how it went: kept on the workload itself, so
    that a restarted or new leader keeps every guard."""

    __pydantic_config__ = FORBID_EXTRA

    last_action: Seconds = 0.0
    failures: Count = 0  # fixes that did not hold (or could not be verified), in a row
    # actions not yet verified
    pending: Annotated[tuple[Pending, ...], Field(max_length=MAX_PENDING)] = ()
    pdb_refusals: Count = 0  # 429s in a row
    last_refusal: Seconds = 0.0

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def to_json(self) -> str:
        return json.dumps(
            {
                "last_action": self.last_action,
                "failures": self.failures,
                "pending": [asdict(p) for p in self.pending],
                "pdb_refusals": self.pdb_refusals,
                "last_refusal": self.last_refusal,
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> WorkloadHistory:
        """Raises ValueError on anything but what ``to_json`` writes (every field)."""
        if len(text) > MAX_HISTORY_BYTES:  # characters: no fewer bytes
            raise ValueError(f"unreadable history: over {MAX_HISTORY_BYTES} bytes")
        try:
            data = json.loads(text)
        except RecursionError:  # nesting deeper than any history
            raise ValueError("unreadable history: nested too deep") from None
        keys = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or set(data) != keys:
            raise ValueError(f"unreadable history: not an object with exactly {sorted(keys)}")
        try:
            return _HISTORY.validate_python(data)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(map(str, first["loc"])) or "the document"
            raise ValueError(f"unreadable history: {where}: {first['msg']}") from None


_HISTORY = TypeAdapter(WorkloadHistory)


def after_verification(h: WorkloadHistory, pending: Pending, outcome: str) -> WorkloadHistory:
    """The history once ``pending`` was judged: a fix that held resets the failures; one
    that did not hold, or could not be verified, adds one (longer cooldown, then give up)."""
    rest = tuple(p for p in h.pending if p != pending)
    return replace(h, pending=rest, failures=0 if outcome == "held" else h.failures + 1)


def landing(pending: Pending, nodes: set[str], outcome: str) -> str | None:
    """Where an eviction's replacements (on ``nodes``) landed against the plan, judged
    with the verification's ``outcome``; None for actions that planned no node."""
    if not pending.nodes or not nodes:
        return None
    if nodes & set(pending.nodes):
        return "planned"
    if outcome in ("held", "no_gain"):
        return "elsewhere_aligned"
    return "elsewhere_misaligned" if outcome == "did_not_hold" else None


def measured_uid(f: Finding) -> str:
    """The pod whose activity says whether a fix of ``f`` paid off: the pod moved or
    resized (its replacements, after), or the feeder a noisy neighbour crowded out."""
    return getattr(f, KINDS[f.kind].measured)


def described(pending: Pending, g: Gain, after: Activity | None) -> str:
    """The gain as the verification's Event says it, e.g. "GPU activity 0.15 -> 0.82
    after moving to gpu-a NUMA node 1: gain 5.47"."""
    if g.ratio is None:
        return g.detail
    kind = pending.kind
    if pending.in_place:
        how = " after its memory moved home in place"
    elif kind in RESIZED:
        how = " after the resize"
    elif kind == NOISY_NEIGHBOUR.name:
        how = " after its noisy neighbour left"
    else:
        numa = f" NUMA node {after.numa_nodes}" if after.numa_nodes else ""
        how = f" after moving to {after.node}{numa}"
    return f"{g.detail}{how}: gain {g.ratio:.2f}"

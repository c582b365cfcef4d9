"""Answers for the verification's queries, and the policy its tests run under."""

from __future__ import annotations

from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import (
    Windows,
)
from numaguard.simulator.parts.prometheus import as_signals
from tests.helpers.planner_rows import healthy, instance

POLICY = Policy(verify_after_seconds=900, verify_deadline_seconds=3600, stale_after_seconds=30)


class Answers:
    """Prometheus as the verifier sees it: the rows each verification query answers, and
    what it says of the replacements' node (healthy unless told)."""

    selector = 'job="numaguard"'
    windows = Windows()

    def __init__(self, rows: dict[str, list[dict]], node=None) -> None:
        self.rows = {**(healthy("n1") if node is None else node), **rows}
        self.asked: list = []

    async def fetch_set(self, queries, required, at):
        self.asked.append(queries)
        return as_signals(at, self.rows, {"n1": instance("n1")}, queries=required)


def verdicts(held_throughout: float, peak: float, age: float = 2.0, uid: str = "new-1"):
    ids = {"node": "n1", "pod_uid": uid}
    return {
        "held_throughout": [{**ids, "value": held_throughout}],
        "peak": [{**ids, "value": peak}],
        "age": [{**ids, "value": age}],
    }

"""The verifier judges a fix on positive evidence only: the replacement's fresh series,
covering the whole verification period, with no verdict of the finding's kind (any
reason). No data, part of the period, stale data or a flapping verdict is "not yet",
and by the deadline "unverified" — never "held"."""

from __future__ import annotations

import pytest
from numaguard.remediator.controller import Controller
from numaguard.remediator.planner import Pending, PodInfo, Policy
from numaguard.remediator.queries import Windows, scoped, verification_expressions
from numaguard.simulator.prometheus import as_signals

from tests.test_planner import COLLECTORS, healthy, instance

NOW = 1_800_000_000.0
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


def replacement(uid: str = "new-1", phase: str = "Running", created: float = NOW - 1000):
    return PodInfo("ml", "trainer.1", uid, "n1", created, phase=phase, workload="Deployment/ml/t")


def verdicts(held_throughout: float, peak: float, age: float = 2.0, uid: str = "new-1"):
    ids = {"node": "n1", "pod_uid": uid}
    return {
        "held_throughout": [{**ids, "value": held_throughout}],
        "peak": [{**ids, "value": peak}],
        "age": [{**ids, "value": age}],
    }


PENDING = Pending("cross_numa", "device_remote", NOW - 1000, "old-1")


async def outcome(rows, pods, pending=PENDING, node=None, now=NOW):
    controller = Controller(Answers(rows, node), None, POLICY)
    return await controller._outcome(pending, pods, now)


@pytest.mark.parametrize(
    ("case", "rows", "expected"),
    [
        ("aligned all period", verdicts(0, 0), "held"),
        # the same kind, another reason: it did not hold either
        ("memory_remote instead", verdicts(1, 1), "did_not_hold"),
        # series younger than the period: the queries' offset leaves these out
        ("not the whole period yet", {"age": verdicts(0, 0)["age"]}, None),
        ("no data at all", {}, None),
        ("stale data", verdicts(0, 0, age=400), None),
        ("flapping", verdicts(0, 1), None),
    ],
)
async def test_only_positive_evidence_decides(case, rows, expected):
    assert await outcome(rows, [replacement()]) == expected, case


async def test_no_verdict_by_the_deadline_is_unverified_never_held():
    late = NOW - POLICY.verify_deadline_seconds - 1
    pending = Pending("cross_numa", "device_remote", late, "old-1")
    for rows, pods in (({}, [replacement(created=late + 5)]), (verdicts(0, 0), [])):
        assert await outcome(rows, pods, pending) == "unverified"


async def test_the_pod_acted_on_its_elders_and_pending_pods_are_no_replacements():
    others = [
        replacement(uid="old-1"),  # the evicted pod itself, still terminating
        replacement(uid="older", created=PENDING.at - 600),  # a replica from before
        replacement(uid="new-2", phase="Pending"),
    ]
    assert await outcome(verdicts(0, 0, uid="old-1"), others) is None


async def test_a_replacement_on_a_stale_node_is_not_judged():
    stale = {
        **healthy("n1"),
        "collector_age": [{"node": "n1", "collector": c, "value": 300} for c in COLLECTORS],
    }
    assert await outcome(verdicts(0, 0), [replacement()], node=stale) is None
    # nothing said of the node at all is no better
    assert await outcome(verdicts(0, 0), [replacement()], node={}) is None


async def test_every_replacement_must_hold_and_the_query_names_them_by_uid():
    rows = verdicts(0, 0)
    rows = {k: [*v, *verdicts(1, 1, uid="new-2")[k]] for k, v in rows.items()}
    answers = Answers(rows)
    controller = Controller(answers, None, POLICY)
    pods = [replacement(), replacement(uid="new-2")]
    assert await controller._outcome(PENDING, pods, NOW) == "did_not_hold"
    verification = verification_expressions(
        "cross_numa", ["new-1", "new-2"], "900s", 'job="numaguard"'
    )
    node = scoped(
        ("targets_up", "collector_age", "collector_success"),
        "node",
        ["n1"],
        Windows(),
        'job="numaguard"',
    )
    assert answers.asked[0] == [*verification.items(), *node]

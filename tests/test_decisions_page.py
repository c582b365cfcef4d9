"""The remediator's decision page (/decisions): the last cycle's findings with their
evidence and decisions — the action and its target, or the guard and what would lift
it — the pods the kubelet refused, what awaits verification and the latest outcomes,
under the mode in large type; served on its metrics port, as JSON too."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest
from aiohttp import ClientSession

from numaguard.remediator.cli import Health, _serve_metrics
from numaguard.remediator.core.cycle_report import CycleReport, Verification
from numaguard.remediator.core.decisions import decisions
from numaguard.remediator.core.findings import FindingState, update
from numaguard.remediator.core.guards import LIFTS
from numaguard.remediator.core.history import Pending
from numaguard.remediator.core.outcome import Gain
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.rejections import storms
from numaguard.remediator.decisions_page import render
from numaguard.remediator.metrics import Metrics
from numaguard.simulator.parts.processes import free_port
from tests.helpers.browser import rendered, screenshot
from tests.helpers.planner_rows import (
    NOW,
    cross_numa,
    healthy,
    merge,
    needs,
    pod_info,
    rejected,
    run,
    signals,
    zone,
)


class Rows(HTMLParser):
    """The page's rows (their data-* attributes and cell texts) and its mode banner."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[dict, list[str]]] = []
        self.mode = ""
        self._in = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr":
            self.rows.append((attrs, []))
        elif tag == "td":
            self.rows[-1][1].append("")
            self._in = "td"
        elif "data-mode" in attrs:
            self._in = "mode"

    def handle_endtag(self, tag):
        self._in = ""

    def handle_data(self, data):
        if self._in == "td":
            self.rows[-1][1][-1] += data
        elif self._in == "mode":
            self.mode += data


def a_cycle(policy: Policy) -> CycleReport:
    """Two cross-NUMA pods: one evicted to n2, one refused as too young; a workload's
    refused pods; an action awaiting verification; an outcome."""
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            cross_numa("trainer", age=4.0),
            cross_numa("young", age=2.0),
            needs("trainer", 8, 32),
            needs("young", 8, 32),
            zone("n2", "1", 16, 200, devices={"nvidia.com/gpu": 1}),
        )
    )
    findings = list(update(FindingState(), sig).open.values())
    pods = [pod_info("trainer"), pod_info("young", created=NOW - 60)]
    report = CycleReport(at=NOW, dry_run=policy.dry_run, paused=policy.paused)
    report.findings = findings
    report.plan = run(sig, pods, policy)
    report.ages = {f.key: 4.0 if f.pod == "trainer" else 2.0 for f in findings}
    report.storms = storms([rejected(f"t{i}", age=i) for i in range(5)], None, policy)
    report.pending = [
        ("Deployment/ml/cache", Pending("cross_numa", "memory_remote", NOW - 90, "u")),
        ("Deployment/ml/db", Pending("cross_numa", "memory_remote", NOW - 30, "v")),
    ]
    report.progress = {
        ("Deployment/ml/cache", NOW - 90, "u"): Gain(1.6, "local memory 0.50 -> 0.80")
    }
    return report


def test_a_dry_run_is_reviewed_on_one_page():
    policy = Policy()  # dry run
    report = a_cycle(policy)
    held = Verification("Deployment/ml/old", "cross_numa", "held", Gain(1.8, "x"), "gain 1.80")
    data = decisions(report, [(NOW - 30, held)], policy)
    page = Rows()
    page.feed(render(data))
    assert page.mode.startswith("DRY RUN")
    by_uid = {attrs["data-pod-uid"]: cells for attrs, cells in page.rows if "data-pod-uid" in attrs}
    trainer, young = by_uid["uid-trainer"], by_uid["uid-young"]
    # the evidence, the action and its target
    assert trainer[3] == "verdict 1, newest sample 4s old"
    assert trainer[4] == "evict (dry run)" and "fits aligned on n2 NUMA node 1" in trainer[5]
    # the refusal and what would lift it
    assert young[4] == "refused: too_young" and young[6] == LIFTS["too_young"]
    texts = [" | ".join(cells) for _, cells in page.rows]
    assert any("Deployment/ml/trainer" in t and "TopologyAffinityError" in t for t in texts)
    # awaiting verification: the gain so far where measured, and saying so where not
    (cache,) = [t for t in texts if t.startswith("Deployment/ml/cache | cross_numa: memory_remote")]
    assert cache.endswith(" | 1.60 (local memory 0.50 -> 0.80)")
    (db,) = [t for t in texts if t.startswith("Deployment/ml/db")]
    assert db.endswith(" | not measured yet")
    assert [p["gain_so_far"] for p in data["pending"]] == [1.6, None]
    assert any("Deployment/ml/old" in t and "held | 1.80" in t for t in texts)
    assert json.loads(json.dumps(data)) == data


def test_the_mode_is_said_first():
    for mode, words in (
        ({"leader": True, "dry_run": False, "paused": False}, "ACTING"),
        ({"leader": True, "dry_run": False, "paused": True}, "PAUSED"),
        ({"leader": False, "dry_run": True, "paused": False}, "NOT THE LEADER"),
    ):
        data = decisions(CycleReport(), [], Policy())
        data["mode"] = mode
        page = Rows()
        page.feed(render(data))
        assert page.mode.startswith(words)


def listening(port: int) -> SimpleNamespace:
    """The run command's server arguments: plain HTTP on ``port``."""
    return SimpleNamespace(
        listen=f"127.0.0.1:{port}",
        web_kubernetes_auth=False,
        web_config_file=None,
        kubeconfig=None,
        idle_timeout=5.0,
        max_connections=8,
    )


async def test_the_leader_serves_it_on_its_metrics_port():
    port = free_port()
    args = listening(port)
    shown: list = []
    runner, _ = await _serve_metrics(args, Metrics(), Health(60), shown)
    url = f"http://127.0.0.1:{port}/decisions"
    try:
        async with ClientSession() as session:
            async with session.get(url) as r:
                assert r.status == 503  # no cycle yet
            report = a_cycle(Policy(dry_run=False))
            shown.append(SimpleNamespace(last_report=report, outcomes=[], policy=Policy()))
            async with session.get(url) as r:
                assert (
                    r.status == 200 and "default-src 'none'" in r.headers["Content-Security-Policy"]
                )
                assert "ACTING" in await r.text()
            async with session.get(f"{url}?format=json") as r:
                data = await r.json()
            assert {f["pod"]: f["decision"] for f in data["findings"]} == {
                "trainer": "evict",
                "young": "refused",
            }
            async with session.get(f"{url}?format=yaml") as r:
                assert r.status == 400
    finally:
        await runner.cleanup()


@pytest.mark.browser
async def test_chromium_shows_the_dry_run_first_and_fetches_nothing():
    port = free_port()
    args = listening(port)
    report = a_cycle(Policy())
    shown = [SimpleNamespace(last_report=report, outcomes=[], policy=Policy())]
    runner, _ = await _serve_metrics(args, Metrics(), Health(60), shown)
    url = f"http://127.0.0.1:{port}/decisions"
    try:
        dom, asked = await rendered(url)
        await screenshot(url, "decisions-dry-run", height=700)
    finally:
        await runner.cleanup()
    assert asked == []
    page = Rows()
    page.feed(dom)
    assert page.mode.startswith("DRY RUN")
    decided = {a["data-pod-uid"]: a["data-decision"] for a, _ in page.rows if "data-pod-uid" in a}
    assert decided == {"uid-trainer": "evict", "uid-young": "refused"}

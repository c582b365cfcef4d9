"""The remediator's rounds of queries against a real Prometheus (2 and 3) holding a
synthetic cluster's series (backfilled with promtool): they open the same findings and
plan the same actions and refusals as the whole query set, from a fraction of its
answers; and the recording rules are read only when Prometheus runs them as the
remediator would write them."""

from __future__ import annotations

import time

import aiohttp
import pytest

from alerts import rules
from numaguard.remediator.controller import Controller
from numaguard.remediator.core import queries as q
from numaguard.remediator.core.findings import FindingState, update
from numaguard.remediator.core.planner import plan
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import Windows
from numaguard.remediator.signals import Prometheus, Source
from numaguard.simulator.cluster.fleet import Fleet, open_nodes, pods_for
from numaguard.simulator.parts.processes import free_port, until
from numaguard.simulator.parts.prometheus import VERSIONS, PrometheusServer, tsdb_blocks

pytestmark = pytest.mark.prometheus

# caps high enough that the cycle's moves use up the free GPUs: later pods find no fit
POLICY = Policy(max_per_cycle=40, max_per_node=4, max_per_namespace=40)


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory):
    fleet = Fleet(60, cross_numa=36, starved=6, oversized=8, tight=0.9)
    end = float(int(time.time()))
    d = tmp_path_factory.mktemp("fleet")
    with (d / "fleet.om").open("w") as out:
        fleet.write(end, out)
    return tsdb_blocks(d / "fleet.om"), end


def decided(findings, signals, at):
    result = plan(findings, pods_for(findings), signals, POLICY, {}, at, open_nodes(signals))
    return (
        [(a.kind, a.finding.pod_uid, a.detail) for a in result.actions],
        [(r.finding.pod_uid, r.guard, r.detail) for r in result.refusals],
    )


@pytest.mark.parametrize("version", VERSIONS)
async def test_rounds_plan_as_the_whole_set_does(backfilled, version):
    blocks, end = backfilled
    async with (
        PrometheusServer([], free_port(), version=version, blocks=blocks) as prom,
        aiohttp.ClientSession() as session,
    ):
        client = Prometheus(prom.url, session)
        whole = await client.fetch(end)
        whole_rows = client.rows_read
        client.rows_read = 0
        controller = Controller(client, None, POLICY)
        signals, state = await controller._gather(end)
        rounds_rows = client.rows_read
        # a second cycle, not looking for slices to size: it follows those found
        again, state_again = await controller._gather(end)
    expected = update(FindingState(), whole)
    kinds = {f.kind for f in expected.open.values()}
    assert kinds == {"cross_numa", "starved", "noisy_neighbour", "oversized"}
    assert set(state.open) == set(state_again.open) == set(expected.open)
    actions, refusals = decided(list(expected.open.values()), whole, end)
    assert {a[0] for a in actions} == {"evict", "recommend"}
    assert "no_fit" in {r[1] for r in refusals}  # the free GPUs ran out
    assert decided(list(state.open.values()), signals, end) == (actions, refusals)
    assert decided(list(state_again.open.values()), again, end) == (actions, refusals)
    # a tenth of the pods are findings here; at 5,000 nodes bench/remediation.py shows 1 %
    assert rounds_rows < whole_rows / 2


@pytest.mark.parametrize("version", VERSIONS)
async def test_recording_rules_are_read_only_when_they_are_ours(version):
    # one exporter target (down: only its `up` matters), of no cluster
    async with (
        PrometheusServer(
            [f"127.0.0.1:{free_port()}"],
            free_port(),
            version=version,
            rule_files=[str(rules.RULES_FILE)],
        ) as prom,
        aiohttp.ClientSession() as session,
    ):
        ours = Prometheus(prom.url, session)

        async def all_recorded():  # once the rule group has run
            return await ours.recorded(time.time()) == frozenset(q.RECORDED)

        await until(all_recorded, "every recording rule read")
        # another finding window: the sustained records say something else
        other = Prometheus(prom.url, session, windows=Windows("5m", "1h"))
        assert await other.recorded(time.time()) == {"slice_sm"}
        # the rules are there, but no server evaluates them for that cluster's targets
        elsewhere = Prometheus(prom.url, session, Source(cluster="gpu-west"))
        assert await elsewhere.recorded(time.time()) == frozenset()
        # long after the rules last ran, they are not believed
        assert await ours.recorded(time.time() + 600) == frozenset()
    read = dict(q.detection(Windows(), q.DEFAULT_SELECTOR, frozenset(q.RECORDED)))
    assert read["cross_numa_sustained"] == 'numaguard:pod_cross_numa:sustained{job="numaguard"}'
    assert "cross_numa_seen" not in read

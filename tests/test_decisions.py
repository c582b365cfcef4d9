"""The decision-quality suite (bench/decisions.py) as a regression check: no action on a
protected pod ever, most remediable findings fixed within three cycles, and, steered,
the replacements on the nodes the plan found to fit."""

from __future__ import annotations

import pytest

from bench.decisions import run_scenario

pytestmark = pytest.mark.cluster


async def test_decisions_on_simulated_clusters(control_plane):
    aligned = await run_scenario(control_plane, 1, 3, ("single-numa-node",))
    assert aligned["violations"] == 0
    assert aligned["remediable"] >= 9  # GPU, memory and CPU-span findings on 3 nodes
    assert aligned["fixed_in_3"] == aligned["remediable"]  # every node can align them
    assert aligned["evictions"] == aligned["fixed_in_3"]  # one eviction per fix
    mixed = await run_scenario(control_plane, 4, 5, ("single-numa-node", "none"))
    assert mixed["violations"] == 0
    # where a kubelet misplaces the replacement, the remediator stops after two tries
    assert mixed["evictions"] <= 2 * mixed["remediable"]
    # steered: every replacement on a node whose zone the plan found to fit, the `none`
    # nodes included
    steered = await run_scenario(control_plane, 4, 5, ("single-numa-node", "none"), steer=True)
    assert steered["violations"] == 0
    assert steered["evictions"] and steered["landed_planned"] == steered["evictions"]
    # steered or not, most fixed within three cycles; those that are not sit on `none`
    # nodes, whose kubelet places a replacement misaligned wherever it lands (measured:
    # 16 of 19 steered every run, 16 or 17 unsteered as the scheduler's tie-breaks fall)
    for run in (mixed, steered):
        assert run["fixed_in_3"] >= 0.75 * run["remediable"], run

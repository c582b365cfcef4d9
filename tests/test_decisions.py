"""The decision-quality suite (bench/decisions.py) as a regression check: no action on a
protected pod ever, and most remediable findings fixed within three cycles."""

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

"""A multi-GPU pod without P2P, fixed through the real kubelet and the device plugin, on
the node VM's GPUs (node_stories.linked_gpus: NUMA node 1's five, only 1 and 2 joined).

Under ``single-numa-node`` the blocker asks 2 GPUs first: the device plugin's
preference (go-gpuallocator's best effort) gives it the joined pair. The trainer's 2
are then two of the others, joined only through the host (NODE: no P2P), and move data
over PCIe. The blocker leaves and the pair is free: the remediator evicts, and the real
kubelet's device manager, asking the plugin among the GPUs free again, gives the
replacement the pair (without that preference it takes any free ones: a Go set's order)."""

from __future__ import annotations

from numaguard.remediator.core.queries import Windows, expressions
from numaguard.simulator.demos.node_stories import WINDOW, NodeLoop, Story, deployment


async def linked(loop: NodeLoop) -> Story:
    story = Story(said=["under single-numa-node, NUMA node 1's GPUs 1 and 2 joined by NVLink:"])
    await loop.start("single-numa-node")
    await loop.gpu_collector(True)
    await loop.given(story, await loop.bare("blocker", 1, gpus=2))
    await loop.cp.create(loop.session, deployment("trainer", 1, gpus=2))
    trainer = await loop.placed(story, "trainer-")
    a, b = story.gpus[trainer["metadata"]["name"]]
    how = "by NVLink" if loop.node.gpus.nvlinked(a, b) else "through the host only (no P2P)"
    story.said.append(f"  GPUs {a} and {b} reach each other {how}; it moves 2 GB/s over PCIe")
    await loop.delete("blocker")
    story.said.append("  the blocker deleted: the NVLink pair is free")
    # as the controller's query sees it: no P2P, while moving data, a whole window
    await loop.prom.wait_for(expressions(Windows(WINDOW, WINDOW))["no_p2p_moving"], 300)
    await loop.cycles(story, loop.controller(), lambda s: s.outcomes)
    return story

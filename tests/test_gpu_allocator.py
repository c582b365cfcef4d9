"""Which GPUs a multi-GPU pod gets (pure): NVIDIA's device plugin's best-effort choice
(go-gpuallocator), in the fake device plugin the node VM's real kubelet asks over its
device plugin API, and in the simulated kubelet that admits pods."""

from __future__ import annotations

import grpc
import pytest

from numaguard.simulator.cluster.node import SimNode, admit
from numaguard.simulator.fakes import gpu_topology
from numaguard.simulator.fakes.deviceplugin import RESOURCE, Plugin, devices_of
from numaguard.simulator.fakes.deviceplugin import api_pb2 as api
from numaguard.simulator.fakes.deviceplugin import api_pb2_grpc as rpc
from numaguard.simulator.fakes.gpu_allocator import best_effort, pair_scores
from numaguard.simulator.fakes.host import FakeContainer, FakeHost, FakeNumaNode, FakePod
from numaguard.simulator.fakes.nvml import FakeNvml


def machine(layout: str) -> tuple[FakeHost, FakeNvml]:
    host = FakeHost(nodes=[FakeNumaNode("0-7", socket=0), FakeNumaNode("8-15", socket=1)])
    nvml = FakeNvml()
    getattr(gpu_topology, layout)(nvml, host)
    return host, nvml


def test_pairs_score_as_go_gpuallocator_scores_their_links():
    _, nvml = machine("pcie")
    score = pair_scores(nvml)
    # behind one switch, across switches, one host bridge, one NUMA node, across sockets
    assert [score(0, 1), score(0, 2), score(4, 6), score(4, 7), score(0, 4)] == [50, 40, 30, 20, 10]
    _, nvml = machine("bridged")
    assert pair_scores(nvml)(0, 1) == 30 + 12 * 100  # one host bridge, and NV12


def test_the_best_split_not_the_greedy_set():
    """Four GPUs, two asked: a greedy pick takes the best pair (0-1) whatever it leaves;
    best effort splits all four so that the pair left is joined too."""
    links = {(0, 1): 300, (0, 2): 200, (1, 3): 200, (2, 3): 10, (0, 3): 0, (1, 2): 0}

    def score(a, b):
        return links[min(a, b), max(a, b)]

    assert best_effort([0, 1, 2, 3], [], 2, score) == [0, 2]  # {0,2}+{1,3}: 400 > 310
    assert best_effort([0, 1, 2, 3], [3], 2, score) == [1, 3]
    assert best_effort([0, 1, 2], [], 2, score) == [0, 1]  # an odd count: padded
    assert best_effort([0, 1], [], 3, score) == []
    assert best_effort([2, 3], [], 1, score) == [2]


@pytest.mark.parametrize(
    ("layout", "free", "size", "given"),
    [
        ("bridged", [0, 1, 2, 3], 2, [0, 1]),
        ("bridged", [1, 2, 3], 2, [2, 3]),  # k8s-device-plugin#546: keep the bridged pair
        ("pcie", [0, 1, 2, 3, 4, 5, 6, 7], 4, [0, 1, 2, 3]),
        ("pcie", [2, 4, 5, 6], 2, [4, 5]),
    ],
)
def test_a_pod_of_several_gpus_gets_the_best_joined_ones(layout, free, size, given):
    _, nvml = machine(layout)
    assert best_effort(free, [], size, pair_scores(nvml)) == given


async def test_the_fake_device_plugin_answers_the_kubelet_s_preferred_allocation(tmp_path):
    """Over the real device plugin API, as the kubelet's device manager asks it."""
    _, nvml = machine("bridged")
    plugin = Plugin(devices_of(nvml.description())[RESOURCE], pair_scores(nvml))
    uuid = [g.uuid for g in nvml.gpus]
    server = grpc.aio.server()
    rpc.add_DevicePluginServicer_to_server(plugin, server)
    socket = f"unix://{tmp_path}/plugin.sock"
    server.add_insecure_port(socket)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(socket) as channel:
            answer = await rpc.DevicePluginStub(channel).GetPreferredAllocation(
                api.PreferredAllocationRequest(
                    container_requests=[
                        api.ContainerPreferredAllocationRequest(
                            available_deviceIDs=[uuid[3], uuid[1], uuid[2]],
                            allocation_size=2,
                        ),
                        api.ContainerPreferredAllocationRequest(
                            available_deviceIDs=uuid,
                            must_include_deviceIDs=[uuid[1]],
                            allocation_size=2,
                        ),
                    ]
                )
            )
    finally:
        await server.stop(None)
    chosen = [list(r.deviceIDs) for r in answer.container_responses]
    assert chosen == [[uuid[2], uuid[3]], [uuid[0], uuid[1]]]


def test_the_simulated_kubelet_gives_a_two_gpu_pod_the_best_joined_pair():
    """single-numa-node: NUMA node 0's CPUs are all held, so NUMA node 1 takes the pod;
    of its free GPUs 5 (behind a switch with the held GPU 4), 6 (on its host bridge) and
    7 (on another host bridge), the pair joined best: 5 and 6 (PHB)."""
    host, nvml = machine("pcie")
    node = SimNode("n", host, nvml, "single-numa-node")
    held = FakeContainer(
        "main", "0-7", {0: 1}, exclusive_cpus=True, devices={"nvidia.com/gpu": [nvml.gpus[4].uuid]}
    )
    host.pods.append(FakePod("holder", "uid-holder", "guaranteed", [held]))
    cpus, units = admit(node, 2, {"nvidia.com/gpu": 2})
    assert cpus == frozenset({8, 9})
    assert [nvml.gpus.index(g) for g in units["nvidia.com/gpu"]] == [5, 6]
    assert admit(node, 2, {"nvidia.com/gpu": 4}) is None  # no NUMA node has four free

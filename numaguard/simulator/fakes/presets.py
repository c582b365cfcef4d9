"""Ready-made fake nodes used by the tests, the demo and the benchmarks."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from numaguard.exporter.readers import format_id_list
from numaguard.exporter.readers.nvml import sysfs_pci_address
from numaguard.simulator.fakes import gpu_topology
from numaguard.simulator.fakes.host import (
    GIB,
    MIB,
    FakeClaim,
    FakeContainer,
    FakeHost,
    FakeNumaNode,
    FakePod,
)
from numaguard.simulator.fakes.nvml import FakeGpu, FakeNvml, FakeSlice, Process


def pod_uid(name: str) -> str:
    """A stable, valid pod UID for a fake pod name."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.pods.numaguard.test"))


def two_socket() -> FakeHost:
    """2 sockets, one NUMA node each, cgroup v2 with the systemd driver and containerd.

    Shared pool: 0-1,6-13,18-31. Pods: one aligned, one whose exclusive CPUs span both
    sockets, one burstable pod in the shared pool.
    """
    shared = "0-1,6-13,18-31"
    return FakeHost(
        nodes=[
            FakeNumaNode(
                "0-15", socket=0, memory_total_bytes=128 * GIB, memory_free_bytes=100 * GIB
            ),
            FakeNumaNode(
                "16-31", socket=1, memory_total_bytes=128 * GIB, memory_free_bytes=90 * GIB
            ),
        ],
        pods=[
            FakePod(
                "trainer-aligned",
                pod_uid("trainer-aligned"),
                "guaranteed",
                [
                    FakeContainer(
                        "main",
                        "2-5",
                        {0: 8 * GIB, 1: 256 * MIB},
                        throttling=(1000, 10, 0.5),
                        pressure={"cpu": (1.5, 0.5), "memory": (0.25, 0.125), "io": (2.0, 1.0)},
                    ),
                ],
                namespace="ml",
            ),
            FakePod(
                "trainer-split",
                pod_uid("trainer-split"),
                "guaranteed",
                [
                    FakeContainer("main", "14-17", {0: 4 * GIB, 1: 4 * GIB}),
                ],
                namespace="ml",
            ),
            FakePod(
                "web",
                pod_uid("web"),
                "burstable",
                [
                    FakeContainer("app", shared, {0: 200 * MIB, 1: 100 * MIB}),
                    FakeContainer("sidecar", shared, {0: 20 * MIB}),
                ],
            ),
        ],
        cgroup_version=2,
        cgroup_driver="systemd",
        runtime="containerd",
    )


def four_node_v1() -> FakeHost:
    """4 NUMA nodes on 2 sockets, cgroup v1 with the cgroupfs driver and docker."""
    return FakeHost(
        nodes=[
            FakeNumaNode("0-7", socket=0, memory_total_bytes=32 * GIB, memory_free_bytes=20 * GIB),
            FakeNumaNode("8-15", socket=0, memory_total_bytes=32 * GIB, memory_free_bytes=21 * GIB),
            FakeNumaNode(
                "16-23", socket=1, memory_total_bytes=32 * GIB, memory_free_bytes=22 * GIB
            ),
            FakeNumaNode(
                "24-31", socket=1, memory_total_bytes=32 * GIB, memory_free_bytes=23 * GIB
            ),
        ],
        distances=[[10, 12, 20, 20], [12, 10, 20, 20], [20, 20, 10, 12], [20, 20, 12, 10]],
        pods=[
            FakePod(
                "db",
                pod_uid("db"),
                "guaranteed",
                [
                    FakeContainer(
                        "postgres", "8-11", {1: 2 * GIB, 2: 1 * GIB}, throttling=(500, 50, 2.25)
                    ),
                ],
                namespace="data",
            ),
            FakePod(
                "batch",
                pod_uid("batch"),
                "guaranteed",
                [
                    FakeContainer("worker", "6-7,12-13", {0: 512 * MIB, 1: 512 * MIB}),
                ],
                namespace="data",
            ),
            FakePod(
                "logger",
                pod_uid("logger"),
                "besteffort",
                [
                    FakeContainer("fluent", "0-5,14-31", {3: 64 * MIB}),
                ],
                namespace="kube-system",
            ),
        ],
        cgroup_version=1,
        cgroup_driver="cgroupfs",
        runtime="docker",
        balancing=None,
        psi=False,
    )


def far_memory() -> FakeHost:
    """2 sockets; a pod whose CPUs are on node 0 while 80% of its memory is on node 1."""
    host = two_socket()
    host.pods = [
        FakePod(
            "cache",
            pod_uid("cache"),
            "guaranteed",
            [
                FakeContainer("redis", "2-3", {0: 1 * GIB, 1: 4 * GIB}),
            ],
            namespace="cache",
        ),
        FakePod(
            "web",
            pod_uid("web"),
            "burstable",
            [
                FakeContainer("app", "0-1,4-31", {0: 100 * MIB, 1: 100 * MIB}),
            ],
        ),
    ]
    return host


def reference_node() -> FakeHost:
    """The reference node (docs/design.md): 8 NUMA nodes on 2 sockets, 224 CPUs (112 cores
    of two threads, numbered as Linux numbers x86 threads: 0 and 14 share a core of NUMA
    node 0), 150 pods / 300 containers (60 Guaranteed pods with a CPU a container, the two
    threads of one core as the static CPU manager gives them, 90 burstable ones)."""
    nodes = [
        FakeNumaNode(
            f"{n * 28}-{n * 28 + 27}",
            socket=n // 4,
            memory_total_bytes=256 * GIB,
            memory_free_bytes=128 * GIB,
        )
        for n in range(8)
    ]
    taken: set[int] = set()
    pods = []
    for i in range(60):
        containers = []
        node, core = divmod(i, 14)
        for j in range(2):
            cpu = node * 28 + core + 14 * j
            taken.add(cpu)
            containers.append(
                FakeContainer(
                    f"c{j}",
                    str(cpu),
                    {node: 2 * GIB, (node + 1) % 8: 256 * MIB},
                    throttling=(1000 + i, i, i / 10),
                    pressure={"cpu": (i, i / 2), "memory": (1, 0.5), "io": (2, 1)},
                )
            )
        pods.append(
            FakePod(
                f"gpu-job-{i}", pod_uid(f"gpu-job-{i}"), "guaranteed", containers, namespace="ml"
            )
        )
    shared = format_id_list(frozenset(range(224)) - taken)
    for i in range(90):
        containers = [
            FakeContainer(
                f"c{j}",
                shared,
                {n: 64 * MIB for n in range(8)},
                throttling=(5000, 100, 1.5),
                pressure={"cpu": (3, 1)},
            )
            for j in range(2)
        ]
        pods.append(
            FakePod(
                f"svc-{i}", pod_uid(f"svc-{i}"), "burstable", containers, namespace=f"team-{i % 10}"
            )
        )
    # with each pod's sandbox cgroup, as on a real node
    return FakeHost(
        nodes=nodes,
        pods=pods,
        cgroup_version=2,
        cgroup_driver="systemd",
        sandboxes=True,
        threads_per_core=2,
    )


def gpu_node(
    clock: Callable[[], float] = time.monotonic, node_id: int = 0
) -> tuple[FakeHost, FakeNvml]:
    """2 sockets (NUMA node 0: CPUs 0-31, node 1: 32-63), 8 H100-80GB, GPUs 0-3 on node 0
    and 4-7 on node 1, MIG mixed, pods using them through their processes:

    * trainer (CPUs 0-7, node 0) on GPU 0, MIG off: aligned, busy.
    * trainer-remote (CPUs 10-15, node 0) on GPU 4 (node 1): device_remote, mostly idle.
    * infer-a (CPUs 8-9) on GPU 1's 3g.40gb slice; infer-b (CPUs 16-17) on a 1g.10gb.
    * notebook-0..2 (burstable, shared pool) on GPU 2's 1g.10gb slices, nearly idle.
    * infer-c (CPUs 32-35, node 1) on GPU 5's 4g.40gb slice.
    * infer-d (CPUs 40-41) holds GPU 5's 3g.40gb slice but runs nothing on it yet.
    * dra-job (CPUs 36-39) got GPU 6 through a DRA claim.

    The kubelet (simulator.fakes.podresources) knows all these allocations; NVML knows the
    processes, which run on every device but infer-d's.
    """
    shared = "18-31,46-63"
    host = FakeHost(
        nodes=[
            FakeNumaNode(
                "0-31", socket=0, memory_total_bytes=512 * GIB, memory_free_bytes=300 * GIB
            ),
            FakeNumaNode(
                "32-63", socket=1, memory_total_bytes=512 * GIB, memory_free_bytes=400 * GIB
            ),
        ],
    )

    def pod(name: str, cpus: str, memory: dict[int, int], qos: str = "guaranteed") -> FakePod:
        main = FakeContainer("main", cpus, memory, exclusive_cpus=qos == "guaranteed")
        p = FakePod(name, pod_uid(name), qos, [main], "ml")
        host.pods.append(p)
        return p

    nvml = FakeNvml(clock, node_id)  # node_id keeps GPU UUIDs apart between nodes
    gpus = [
        nvml.add_gpu("H100-80GB", 0, None, 60 * GIB, sm=0.9, graphics=0.95, tensor=0.7),
        nvml.add_gpu("H100-80GB", 0, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]),
        nvml.add_gpu("H100-80GB", 0, ["1g.10gb"] * 7),
        nvml.add_gpu("H100-80GB", 0),
        nvml.add_gpu("H100-80GB", 1, None, 20 * GIB, sm=0.1, graphics=0.15),
        nvml.add_gpu("H100-80GB", 1, ["4g.40gb", "3g.40gb"]),
        nvml.add_gpu("H100-80GB", 1),
        nvml.add_gpu("H100-80GB", 1),
    ]

    def use(
        p: FakePod, unit: FakeGpu | FakeSlice, used_bytes: int, running: bool = True, **activity
    ) -> None:
        resource = (
            f"nvidia.com/mig-{unit.profile.name}"
            if isinstance(unit, FakeSlice)
            else "nvidia.com/gpu"
        )
        p.containers[0].devices.setdefault(resource, []).append(unit.uuid)
        if not running:
            return
        unit.processes.append(Process(host.pid(p, p.containers[0]), used_bytes))
        if isinstance(unit, FakeSlice):
            unit.memory_used_bytes = used_bytes
            unit.activity.set(**activity)

    use(pod("trainer", "0-7", {0: 64 * GIB}), gpus[0], 60 * GIB)
    use(pod("trainer-remote", "10-15", {0: 32 * GIB}), gpus[4], 20 * GIB)
    use(pod("infer-a", "8-9", {0: 8 * GIB}), gpus[1].mig[0], 30 * GIB, sm=0.6, graphics=0.7)
    use(pod("infer-b", "16-17", {0: 4 * GIB}), gpus[1].mig[2], 1 * GIB, sm=0.02, graphics=0.05)
    for i in range(3):
        notebook = pod(f"notebook-{i}", shared, {0: 2 * GIB, 1: 1 * GIB}, "burstable")
        use(notebook, gpus[2].mig[i], 512 * MIB, sm=0.01, graphics=0.02)
    use(pod("infer-c", "32-35", {1: 8 * GIB}), gpus[5].mig[0], 35 * GIB, sm=0.7, tensor=0.5)
    use(pod("infer-d", "40-41", {1: 2 * GIB}), gpus[5].mig[1], 0, running=False)
    dra = pod("dra-job", "36-39", {1: 16 * GIB})
    dra.containers[0].claims.append(FakeClaim("gpu-claim", "gpu-6"))
    gpus[6].processes.append(Process(host.pid(dra, dra.containers[0]), 40 * GIB))
    gpus[6].memory_used_bytes = 40 * GIB
    gpus[6].activity.set(sm=0.8, graphics=0.85)
    pod("web", shared, {0: 200 * MIB, 1: 100 * MIB}, "burstable")
    for gpu in nvml.gpus:
        host.pci_devices[sysfs_pci_address(gpu.pci_bus_id)] = gpu.numa_node
    return host, nvml


def reference_gpu_node(
    clock: Callable[[], float] = time.monotonic,
) -> tuple[FakeHost, FakeNvml]:
    """The reference node (docs/design.md) with its GPUs: the reference node, 8 H100-80GB
    of an HGX board (each behind a PCIe switch of its own, all on NVSwitches; GPU g on NUMA
    node g) with 7 1g.10gb slices each, and 48 of its Guaranteed pods using them, known to
    the kubelet and running on them: 8 pipeline jobs with a slice on each of two
    neighbouring GPUs (multi-device pods), 40 with one slice."""
    host = reference_node()
    nvml = FakeNvml(clock)
    jobs = [p for p in host.pods if p.qos_class == "guaranteed"]
    for g in range(8):
        gpu = nvml.add_gpu("H100-80GB", g, ["1g.10gb"] * 7)
        gpu.pci_root, gpu.pci_switch = f"0000:{0x10 * g:02x}", f"sw{g}"
        gpu.nvlinks = [gpu_topology.NVSWITCHES[k % 4] for k in range(18)]
    gpu_topology.lay_out(nvml, host)
    held = [[(i, 0), ((i + 1) % 8, 1)] for i in range(8)]
    held += [[(g, s)] for g in range(8) for s in range(2, 7)]
    for pod in jobs[:56]:
        for ctr in pod.containers:  # a core a pod, a thread a container
            ctr.exclusive_cpus = True
    for pod, slices in zip(jobs, held, strict=False):
        main = pod.containers[0]
        for g, s in slices:
            mig = nvml.gpus[g].mig[s]
            main.devices.setdefault("nvidia.com/mig-1g.10gb", []).append(mig.uuid)
            mig.processes.append(Process(host.pid(pod, main), 4 * GIB))
            mig.memory_used_bytes = 4 * GIB
            mig.activity.set(sm=0.3 + 0.01 * g, graphics=0.4, tensor=0.2, dram_bandwidth=0.1)
    return host, nvml


PRESETS = {"gpu_node": gpu_node, "reference_gpu_node": reference_gpu_node}


def linked_gpu_node(clock: Callable[[], float] = time.monotonic) -> tuple[FakeHost, FakeNvml]:
    """gpu_topology.pcie's 8 PCIe cards (GPU 7 in two 3g.40gb slices), GPUs 4 and 5
    joined by an NVLink bridge of 4 links that GPU 4 sends over, and pods holding several
    devices each, busy on all of them:

    * near: GPUs 0 and 1, one PCIe switch apart (pix): P2P works;
    * far: GPUs 2 and 4, across sockets (sys): no P2P;
    * split: GPU 5 in one container, GPU 6 in another (phb between them);
    * sliced: both slices of GPU 7 in one container.
    """
    host = FakeHost(
        nodes=[
            FakeNumaNode("0-15", socket=0, memory_total_bytes=512 * GIB),
            FakeNumaNode("16-31", socket=1, memory_total_bytes=512 * GIB),
        ],
    )
    nvml = FakeNvml(clock)
    gpu_topology.pcie(nvml, host)
    nvml.gpus[4].nvlinks, nvml.gpus[5].nvlinks = [5] * 4, [4] * 4
    nvml.set_mig(7, ["3g.40gb", "3g.40gb"])
    held = {
        "near": [("main", "0-1", [0, 1])],
        "far": [("main", "2-3", [2, 4])],
        "split": [("a", "16-17", [5]), ("b", "18-19", [6])],
        "sliced": [("main", "20-21", ["7/0", "7/1"])],
    }
    for name, containers in held.items():
        pod = FakePod(name, pod_uid(name), "guaranteed", [], "ml")
        host.pods.append(pod)
        for cname, cpus, units in containers:
            numa = 0 if int(cpus.split("-")[0]) < 16 else 1
            ctr = FakeContainer(cname, cpus, {numa: 2 * GIB}, exclusive_cpus=True)
            pod.containers.append(ctr)
            for unit in units:
                if isinstance(unit, str):
                    gpu, index = map(int, unit.split("/"))
                    device: FakeGpu | FakeSlice = nvml.gpus[gpu].mig[index]
                    resource = f"nvidia.com/mig-{device.profile.name}"
                else:
                    device, resource = nvml.gpus[unit], "nvidia.com/gpu"
                ctr.devices.setdefault(resource, []).append(device.uuid)
                device.processes.append(Process(host.pid(pod, ctr), 4 * GIB))
                device.activity.set(sm=0.6, graphics=0.7)
    nvml.gpus[4].activity.set(nvlink_tx=3 * GIB, nvlink_rx=GIB)
    return host, nvml

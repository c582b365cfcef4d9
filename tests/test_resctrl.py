"""resctrl: per-domain, per-NUMA-node and per-pod traffic over fake trees whose kernel
side (groups, RMIDs, task moves) is the simulator's, with a fake clock so that rates
are exact."""

from __future__ import annotations

import errno

import pytest

import numaguard.exporter.sources as sources
from numaguard.exporter.sources.cgroups import CgroupSource
from numaguard.exporter.sources.resctrl import RESYNC_CYCLES
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import GIB, MIB, FakeHostRoot
from numaguard.simulator.fakes.resctrl import FakeResctrl
from tests.conftest import make_collection, metadata_of, samples, series

INTERVAL = 15.0


class Node:
    """A fake host with resctrl and an exporter collection on a fake clock."""

    def __init__(self, tmp_path, host, mode="auto", **resctrl):
        self.host = host
        self.root = FakeHostRoot(tmp_path / "host", host).write()
        self.kernel = FakeResctrl(self.root.root, host, **resctrl).write()
        self.now = 1000.0
        self.mode = mode
        self.collection = self.new_collection()

    def new_collection(self):
        collection = make_collection(
            self.root, resctrl=self.kernel, resctrl_mode=self.mode, clock=lambda: self.now
        )
        collection.metadata = lambda: metadata_of(self.host)  # pods come and go
        return collection

    async def cycle(self) -> dict:
        self.root.write()
        self.kernel.write()
        await self.collection.run_once()
        self.now += INTERVAL
        return samples(self.collection.exposition.text)

    def uid(self, pod: str) -> str:
        return self.host.pod(pod).uid


def pod_series(node: Node, name: str, pod: str, **labels):
    p = node.host.pod(pod)
    return series(name, namespace=p.namespace, pod=pod, pod_uid=p.uid, **labels)


async def test_two_sockets_bandwidth_and_remote_ratio_per_domain_node_and_pod(tmp_path):
    node = Node(tmp_path, presets.two_socket())
    await node.cycle()  # groups are made and tasks moved: traffic from now on is theirs
    k = node.kernel
    k.add_traffic(node.uid("trainer-aligned"), 0, total=30 * GIB, local=27 * GIB)
    k.add_traffic(node.uid("trainer-split"), 0, total=6 * GIB, local=3 * GIB)
    k.add_traffic(node.uid("trainer-split"), 1, total=9 * GIB, local=6 * GIB)
    k.add_traffic(None, 1, total=3 * GIB, local=3 * GIB)  # tasks outside any pod
    k.set_occupancy(node.uid("trainer-aligned"), 0, 48 * MIB)
    k.set_occupancy(node.uid("web"), 1, 4 * MIB)
    got = await node.cycle()

    # L3 domain 0 = socket 0 = NUMA node 0; domain 1 = socket 1 = node 1
    assert (
        got[
            series(
                "numaguard_l3_domain_info", l3_domain="0", socket="0", numa_node="0", cpulist="0-15"
            )
        ]
        == 1
    )
    assert got[series("numaguard_l3_llc_capacity_bytes", l3_domain="0")] == 64 * MIB
    assert got[series("numaguard_l3_memory_traffic_bytes_total", l3_domain="0")] == 36 * GIB
    assert got[series("numaguard_l3_memory_traffic_local_bytes_total", l3_domain="0")] == 30 * GIB
    assert (
        got[series("numaguard_l3_memory_bandwidth_bytes_per_second", l3_domain="0")]
        == 36 * GIB / 15
    )
    assert got[series("numaguard_l3_remote_traffic_ratio", l3_domain="0")] == pytest.approx(1 / 6)
    assert (
        got[series("numaguard_l3_memory_bandwidth_bytes_per_second", l3_domain="1")]
        == 12 * GIB / 15
    )
    assert got[series("numaguard_l3_remote_traffic_ratio", l3_domain="1")] == pytest.approx(0.25)
    assert got[series("numaguard_l3_llc_occupancy_bytes", l3_domain="0")] == 48 * MIB
    assert (
        got[series("numaguard_numa_node_memory_bandwidth_bytes_per_second", numa_node="1")]
        == 12 * GIB / 15
    )
    assert got[series("numaguard_numa_node_remote_traffic_ratio", numa_node="0")] == pytest.approx(
        1 / 6
    )
    assert got[series("numaguard_numa_node_llc_occupancy_bytes", numa_node="1")] == 4 * MIB

    split = "trainer-split"
    assert (
        got[pod_series(node, "numaguard_pod_memory_traffic_bytes_total", split, l3_domain="1")]
        == 9 * GIB
    )
    assert (
        got[pod_series(node, "numaguard_pod_memory_bandwidth_bytes_per_second", split)]
        == 15 * GIB / 15
    )
    assert got[pod_series(node, "numaguard_pod_remote_traffic_ratio", split)] == pytest.approx(0.4)
    aligned = "trainer-aligned"
    assert got[pod_series(node, "numaguard_pod_remote_traffic_ratio", aligned)] == pytest.approx(
        0.1
    )
    assert got[pod_series(node, "numaguard_pod_llc_share_ratio", aligned, l3_domain="0")] == 0.75
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "web")] == 1
    # web moved no memory: rate 0, and no ratio of nothing
    assert got[pod_series(node, "numaguard_pod_memory_bandwidth_bytes_per_second", "web")] == 0
    assert pod_series(node, "numaguard_pod_remote_traffic_ratio", "web") not in got
    assert got[series("numaguard_resctrl_rmids", state="used")] == 4
    assert got[series("numaguard_resctrl_rmids", state="free")] == 252
    assert got[series("numaguard_collector_success", collector="resctrl")] == 1

    # next interval: rates and ratios cover that interval only
    k.add_traffic(node.uid("trainer-aligned"), 0, total=15 * GIB, local=15 * GIB)
    got = await node.cycle()
    assert got[pod_series(node, "numaguard_pod_memory_bandwidth_bytes_per_second", aligned)] == GIB
    assert got[pod_series(node, "numaguard_pod_remote_traffic_ratio", aligned)] == 0
    assert got[series("numaguard_l3_memory_bandwidth_bytes_per_second", l3_domain="1")] == 0


async def test_sub_numa_clustering_gives_per_node_traffic(tmp_path):
    host = presets.two_socket()
    # SNC2: each socket's L3 is shared by two NUMA nodes
    host.nodes = [
        type(host.nodes[0])(cpus, socket=s, memory_total_bytes=64 * GIB, memory_free_bytes=32 * GIB)
        for cpus, s in (("0-7", 0), ("8-15", 0), ("16-23", 1), ("24-31", 1))
    ]
    node = Node(tmp_path, host, snc={0: [0, 1], 1: [2, 3]})
    await node.cycle()
    k = node.kernel
    k.add_traffic(node.uid("trainer-aligned"), 0, total=10 * GIB, local=8 * GIB, node=0)
    k.add_traffic(node.uid("trainer-split"), 0, total=5 * GIB, local=1 * GIB, node=1)
    k.add_traffic(node.uid("trainer-split"), 1, total=5 * GIB, local=5 * GIB, node=2)
    k.set_occupancy(None, 1, 8 * MIB, node=3)
    got = await node.cycle()
    assert (
        got[
            series(
                "numaguard_l3_domain_info",
                l3_domain="0",
                socket="0",
                numa_node="0,1",
                cpulist="0-15",
            )
        ]
        == 1
    )
    assert (
        got[series("numaguard_l3_memory_bandwidth_bytes_per_second", l3_domain="0")]
        == 15 * GIB / 15
    )
    assert got[series("numaguard_l3_remote_traffic_ratio", l3_domain="0")] == pytest.approx(0.4)
    for numa, rate, ratio in (
        ("0", 10 * GIB / 15, 0.2),
        ("1", 5 * GIB / 15, 0.8),
        ("2", 5 * GIB / 15, 0.0),
    ):
        assert (
            got[series("numaguard_numa_node_memory_bandwidth_bytes_per_second", numa_node=numa)]
            == rate
        )
        assert got[
            series("numaguard_numa_node_remote_traffic_ratio", numa_node=numa)
        ] == pytest.approx(ratio)
    assert got[series("numaguard_numa_node_memory_bandwidth_bytes_per_second", numa_node="3")] == 0
    assert got[series("numaguard_numa_node_llc_occupancy_bytes", numa_node="3")] == 8 * MIB
    assert got[
        pod_series(node, "numaguard_pod_remote_traffic_ratio", "trainer-split")
    ] == pytest.approx(0.4)


async def test_recreated_group_gives_no_negative_rate(tmp_path):
    node = Node(tmp_path, presets.two_socket())
    aligned = node.uid("trainer-aligned")
    await node.cycle()
    node.kernel.add_traffic(aligned, 0, total=10 * GIB, local=9 * GIB)
    got = await node.cycle()
    assert (
        got[pod_series(node, "numaguard_pod_memory_bandwidth_bytes_per_second", "trainer-aligned")]
        > 0
    )

    node.kernel.remove_behind_the_exporters_back(aligned)  # someone rmdir'ed it
    got = await node.cycle()  # the exporter recreates it: its counters start again at 0
    assert f"numaguard-{aligned}" in node.kernel.group_names()
    rate = pod_series(node, "numaguard_pod_memory_bandwidth_bytes_per_second", "trainer-aligned")
    assert rate not in got
    assert pod_series(node, "numaguard_pod_remote_traffic_ratio", "trainer-aligned") not in got
    assert (
        got[
            pod_series(
                node, "numaguard_pod_memory_traffic_bytes_total", "trainer-aligned", l3_domain="0"
            )
        ]
        == 0
    )
    # the node's totals lost that group's counts too (as the kernel's do): no rate, not < 0
    assert series("numaguard_l3_memory_bandwidth_bytes_per_second", l3_domain="0") not in got
    assert all(v >= 0 for k, v in got.items() if k[0].endswith("_per_second"))
    assert got[series("numaguard_collector_success", collector="resctrl")] == 1

    node.kernel.add_traffic(aligned, 0, total=3 * GIB, local=3 * GIB)
    got = await node.cycle()
    assert got[rate] == 3 * GIB / 15


async def test_rmid_exhaustion_prefers_guaranteed_pods_and_reports_the_rest(tmp_path):
    node = Node(tmp_path, presets.two_socket(), num_rmids=3)  # default group + 2
    got = await node.cycle()
    assert node.kernel.group_names() == sorted(
        f"numaguard-{node.uid(p)}" for p in ("trainer-aligned", "trainer-split")
    )
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "web")] == 0
    assert got[series("numaguard_resctrl_unmonitored_pods")] == 1
    assert got[series("numaguard_resctrl_rmid_exhaustions_total")] == 1
    assert got[series("numaguard_resctrl_rmids", state="free")] == 0
    # unmonitored is not zero: no traffic series at all for web
    assert not [k for k in got if ("pod", "web") in k[1] and "traffic" in k[0]]
    assert got[series("numaguard_collector_success", collector="resctrl")] == 1


async def test_a_guaranteed_pod_takes_the_group_of_a_burstable_one_when_rmids_run_out(tmp_path):
    host = presets.two_socket()
    late = host.pod("trainer-split")
    host.pods.remove(late)
    node = Node(tmp_path, host, num_rmids=3)
    await node.cycle()
    web = f"numaguard-{node.uid('web')}"
    assert web in node.kernel.group_names()
    host.pods.append(late)
    await node.cycle()  # no RMID for the new Guaranteed pod: web's group is given up
    assert web not in node.kernel.group_names()
    got = await node.cycle()
    assert f"numaguard-{late.uid}" in node.kernel.group_names()
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "trainer-split")] == 1
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "web")] == 0


async def test_vanished_pod_loses_its_group_and_new_threads_join(tmp_path):
    host = presets.two_socket()
    node = Node(tmp_path, host)
    await node.cycle()
    web = node.uid("web")
    host.pods = [p for p in host.pods if p.name != "web"]
    ctr = host.pod("trainer-aligned").containers[0]
    ctr.tids = [*host.tids(host.pod("trainer-aligned"), ctr), 424242]
    got = await node.cycle()
    assert f"numaguard-{web}" not in node.kernel.group_names()
    assert 424242 in node.kernel.groups[f"numaguard-{node.uid('trainer-aligned')}"].tasks
    assert not [k for k in got if ("pod", "web") in k[1]]
    assert got[series("numaguard_collector_success", collector="resctrl")] == 1


async def test_thread_exiting_before_its_move_is_not_an_error(tmp_path):
    host = presets.two_socket()
    ctr = host.pod("web").containers[0]
    node = Node(tmp_path, host)
    ctr.tids = [*host.tids(host.pod("web"), ctr), 515151]
    node.root.write()  # the cgroup lists it ...
    ctr.tids = ctr.tids[:-1]  # ... but it is gone by the time the kernel sees the move
    await node.collection.run_once()
    got = samples(node.collection.exposition.text)
    assert got[series("numaguard_collector_success", collector="resctrl")] == 1


async def test_unavailable_values_are_counted_and_never_numbers(tmp_path):
    node = Node(tmp_path, presets.two_socket())
    await node.cycle()
    aligned = f"numaguard-{node.uid('trainer-aligned')}"
    node.kernel.unreadable[(aligned, 0, None, "mbm_total_bytes")] = "Unavailable"
    node.kernel.unreadable[(None, 1, None, "llc_occupancy")] = "Error"
    node.kernel.unreadable[(aligned, 1, None, "mbm_local_bytes")] = "Unassigned"
    got = await node.cycle()
    assert got[series("numaguard_resctrl_unreadable_values_total", reason="unavailable")] == 1
    assert got[series("numaguard_resctrl_unreadable_values_total", reason="error")] == 1
    assert got[series("numaguard_resctrl_unreadable_values_total", reason="unassigned")] == 1
    assert (
        pod_series(
            node, "numaguard_pod_memory_traffic_bytes_total", "trainer-aligned", l3_domain="0"
        )
        not in got
    )
    assert (
        pod_series(node, "numaguard_pod_memory_bandwidth_bytes_per_second", "trainer-aligned")
        not in got
    )
    assert series("numaguard_l3_llc_occupancy_bytes", l3_domain="1") not in got
    assert got[series("numaguard_l3_llc_occupancy_bytes", l3_domain="0")] == 0
    # the domain's own total was readable: its traffic still shows
    assert series("numaguard_l3_memory_traffic_bytes_total", l3_domain="0") in got
    assert got[series("numaguard_collector_success", collector="resctrl")] == 1


async def test_restart_reuses_groups_without_duplicates(tmp_path):
    node = Node(tmp_path, presets.two_socket())
    await node.cycle()
    node.kernel.add_traffic(node.uid("trainer-aligned"), 0, total=5 * GIB, local=5 * GIB)
    groups = node.kernel.group_names()
    node.collection = node.new_collection()  # the exporter restarts
    await node.cycle()
    got = await node.cycle()
    assert node.kernel.group_names() == groups
    assert len(groups) == len(node.host.pods)
    assert (
        got[
            pod_series(
                node, "numaguard_pod_memory_traffic_bytes_total", "trainer-aligned", l3_domain="0"
            )
        ]
        == 5 * GIB
    )


async def test_read_only_mode_never_writes(tmp_path):
    node = Node(tmp_path, presets.two_socket(), mode="read-only")
    node.kernel.mkdir(str(node.kernel.base / "mon_groups" / f"numaguard-{node.uid('web')}"))
    got = await node.cycle()
    assert node.kernel.group_names() == [f"numaguard-{node.uid('web')}"]
    assert got[series("numaguard_resctrl_mode_info", mode="read-only")] == 1
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "web")] == 1
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "trainer-aligned")] == 0
    # no task was moved either
    assert node.kernel.groups[f"numaguard-{node.uid('web')}"].tasks == set()


async def test_off_and_absent_resctrl_leave_other_signals_flowing(tmp_path):
    for mode, with_tree in (("off", True), ("auto", False)):
        host = presets.two_socket()
        root = FakeHostRoot(tmp_path / f"{mode}-{with_tree}", host).write()
        kernel = FakeResctrl(root.root, host)
        if with_tree:
            kernel.write()
        collection = make_collection(
            root, metadata=metadata_of(host), resctrl=kernel, resctrl_mode=mode
        )
        await collection.run_once()
        got = samples(collection.exposition.text)
        assert got[series("numaguard_resctrl_available")] == 0
        assert (
            got[series("numaguard_resctrl_mode_info", mode="off" if with_tree else "unavailable")]
            == 1
        )
        assert not kernel.group_names()
        assert got[series("numaguard_collector_success", collector="resctrl")] == 1
        assert got[series("numaguard_numa_node_memory_total_bytes", numa_node="0")] == 128 * GIB


async def test_the_kernel_refuses_foreign_moves(tmp_path):
    """A pod whose tasks another tool put in its own control group cannot be moved into
    a monitoring group of the default one: counted as a write error, nothing breaks."""
    host = presets.two_socket()
    node = Node(tmp_path, host)
    original = node.kernel.move_task

    def refuse(tasks_file, tid):
        if tid in host.tids(host.pod("web"), host.pod("web").containers[0]):
            raise OSError(22, "Invalid argument", tasks_file)
        original(tasks_file, tid)

    node.kernel.move_task = refuse
    got = await node.cycle()
    assert got[series("numaguard_collector_errors_total", collector="resctrl", reason="write")] >= 1
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "trainer-aligned")] == 1
    # its group holds none of its threads: unknown, never the 0 B/s the group reads
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "web")] == 0
    assert not [k for k in got if ("pod", "web") in k[1] and "traffic" in k[0]]
    assert not [k for k in got if ("pod", "web") in k[1] and "llc" in k[0]]
    node.kernel.move_task = original  # the other tool lets go
    got = await node.cycle()
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "web")] == 1


async def test_rmids_in_limbo_are_a_wait_not_an_error(tmp_path):
    """A removed group's RMID stays in limbo while the cache holds lines it counted; the
    kernel then answers mkdir with EBUSY: RMIDs exhausted for now (no write error, none
    shown free), the pod unmonitored, and monitored once the RMID comes back."""
    host = presets.two_socket()
    node = Node(tmp_path, host, num_rmids=3, limbo=True)  # default group + 2
    await node.cycle()  # the two Guaranteed pods get groups; web does not (ENOSPC)
    host.pods.remove(host.pod("trainer-split"))
    got = await node.cycle()  # its group goes, its RMID into limbo: web gets EBUSY
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "web")] == 0
    assert got[series("numaguard_resctrl_rmid_exhaustions_total")] == 2
    assert got[series("numaguard_resctrl_rmids", state="free")] == 0
    assert got[series("numaguard_resctrl_rmids", state="limbo")] == 1
    assert got[series("numaguard_collector_errors_total", collector="resctrl", reason="write")] == 0
    assert got[series("numaguard_collector_success", collector="resctrl")] == 1
    # nothing else is given up for an RMID that comes back by itself
    assert f"numaguard-{node.uid('trainer-aligned')}" in node.kernel.group_names()
    node.kernel.release_limbo()
    got = await node.cycle()
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "web")] == 1
    assert not [k for k in got if k[0] == "numaguard_resctrl_rmids" and ("state", "limbo") in k[1]]


async def test_over_the_pod_guard_no_group_is_removed(fake_root):
    """Pods the cardinality guard left unread are unknown, not gone: their resctrl
    groups stay."""
    root = fake_root(presets.two_socket())
    kernel = FakeResctrl(root.root, root.host).write()
    collection = make_collection(root, metadata=metadata_of(root.host), resctrl=kernel)
    await collection.run_once()
    groups = kernel.group_names()
    assert groups
    collection.sources["pod_placement"] = CgroupSource(str(root.root), max_pods=1)
    await collection.run_once()
    assert collection.limited
    assert kernel.group_names() == groups


async def test_tasks_are_synced_again_only_when_threads_change_or_every_few_cycles(tmp_path):
    """A group's task list is read (and threads moved) when its pod's thread lists
    changed since they were last all moved, and every RESYNC_CYCLES-th cycle anyway: a
    thread some other tool moved out behind the exporter's back comes back then."""
    host = presets.two_socket()
    node = Node(tmp_path, host)
    group = f"numaguard-{node.uid('trainer-aligned')}"
    await node.cycle()
    reads: list[str] = []
    original = sources.read_text

    def recording(path: str) -> str:
        reads.append(path)
        return original(path)

    sources.read_text = recording
    try:
        await node.cycle()
        assert not [p for p in reads if "/mon_groups/" in p and p.endswith("/tasks")]
        tid = min(node.kernel.groups[group].tasks)
        node.kernel.groups[group].tasks.discard(tid)  # moved out by someone else
        node.kernel.default.tasks.add(tid)
        for _ in range(RESYNC_CYCLES - 2):
            await node.cycle()
            assert tid not in node.kernel.groups[group].tasks  # not looked at yet
        await node.cycle()
        assert tid in node.kernel.groups[group].tasks  # the periodic sync put it back
        reads.clear()
        ctr = host.pod("trainer-aligned").containers[0]
        ctr.tids = [*host.tids(host.pod("trainer-aligned"), ctr), 434343]
        await node.cycle()  # a new thread: its pod's list changed, synced at once
        assert 434343 in node.kernel.groups[group].tasks
        assert f"{node.kernel.base}/mon_groups/{group}/tasks" in reads
    finally:
        sources.read_text = original


def counters(got: dict, domain: str) -> tuple[float, float]:
    return (
        got[series("numaguard_resctrl_mbm_counters", l3_domain=domain, state="used")],
        got[series("numaguard_resctrl_mbm_counters", l3_domain=domain, state="free")],
    )


async def test_abmc_counters_go_by_priority_and_an_uncounted_pod_is_unknown(tmp_path):
    """AMD's assignable counters: 6 per domain, 2 of them the default group's; with two
    MBM events a group, two pods' groups are counted. The Guaranteed pods come first;
    web's group reads Unassigned: unmonitored, no traffic series (its LLC occupancy,
    which needs no counter, still shown), and the node totals are said to be partial."""
    node = Node(tmp_path, presets.two_socket(), abmc_counters=6)
    await node.cycle()
    k = node.kernel
    web = f"numaguard-{node.uid('web')}"
    assert k.assigned[web] == set()
    k.add_traffic(node.uid("trainer-aligned"), 0, total=30 * GIB, local=27 * GIB)
    k.add_traffic(node.uid("web"), 0, total=6 * GIB, local=6 * GIB)
    k.set_occupancy(node.uid("web"), 1, 4 * MIB)
    got = await node.cycle()
    assert counters(got, "0") == (6, 0) and counters(got, "1") == (6, 0)
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "trainer-aligned")] == 1
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "web")] == 0
    assert got[series("numaguard_resctrl_unmonitored_pods")] == 1
    assert not [k for k in got if ("pod", "web") in k[1] and "traffic" in k[0]]
    llc = pod_series(node, "numaguard_pod_llc_occupancy_bytes", "web", l3_domain="1")
    assert got[llc] == 4 * MIB
    # web's 6 GiB are in no counter: domain 0 counts the trainer's 30 only, and says so
    assert got[series("numaguard_l3_memory_traffic_bytes_total", l3_domain="0")] == 30 * GIB
    assert got[series("numaguard_resctrl_mbm_totals_partial", l3_domain="0")] == 1
    assert got[series("numaguard_resctrl_unreadable_values_total", reason="unassigned")] >= 2
    assert got[series("numaguard_collector_errors_total", collector="resctrl", reason="write")] == 0
    assert got[series("numaguard_collector_success", collector="resctrl")] == 1


async def test_abmc_a_guaranteed_pod_takes_the_counters_of_a_burstable_one(tmp_path):
    host = presets.two_socket()
    late = host.pod("trainer-split")
    host.pods.remove(late)
    node = Node(tmp_path, host, abmc_counters=6)
    got = await node.cycle()
    assert got[series("numaguard_resctrl_mbm_totals_partial", l3_domain="0")] == 0
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "web")] == 1
    host.pods.append(late)
    await node.cycle()  # its group is made with no counter free: web's are taken back
    split, web = (f"numaguard-{node.uid(p)}" for p in ("trainer-split", "web"))
    events = {(e, d) for e in ("mbm_total_bytes", "mbm_local_bytes") for d in (0, 1)}
    assert node.kernel.assigned[split] == events
    assert node.kernel.assigned[web] == set()
    got = await node.cycle()
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "trainer-split")] == 1
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "web")] == 0
    assert got[series("numaguard_resctrl_mbm_totals_partial", l3_domain="1")] == 1
    # and back when a counted pod goes
    host.pods.remove(host.pod("trainer-aligned"))
    await node.cycle()
    got = await node.cycle()
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "web")] == 1
    assert got[series("numaguard_resctrl_mbm_totals_partial", l3_domain="1")] == 0


async def test_abmc_read_only_assigns_nothing_and_still_says_what_is_uncounted(tmp_path):
    node = Node(tmp_path, presets.two_socket(), abmc_counters=6)
    await node.cycle()  # managed: web's group has no counter
    node.mode = "read-only"
    node.collection = node.new_collection()
    assigned = {g: set(p) for g, p in node.kernel.assigned.items()}
    got = await node.cycle()
    assert node.kernel.assigned == assigned
    assert got[pod_series(node, "numaguard_pod_resctrl_monitored", "web")] == 0
    assert got[series("numaguard_resctrl_mbm_totals_partial", l3_domain="0")] == 1
    assert counters(got, "0") == (6, 0)


def test_the_fake_kernel_refuses_counters_it_does_not_have(tmp_path):
    host = presets.two_socket()
    root = FakeHostRoot(tmp_path / "host", host).write()
    kernel = FakeResctrl(root.root, host, abmc_counters=2).write()  # the default group's
    group = kernel.base / "mon_groups/numaguard-x"
    kernel.mkdir(str(group))
    assert (group / "mon_data/mon_L3_00/mbm_total_bytes").read_text() == "Unassigned\n"
    with pytest.raises(OSError) as err:
        kernel.assign(f"{group}/mbm_L3_assignments", "mbm_total_bytes:0=e")
    assert err.value.errno == errno.ENOSPC
    assert kernel.last_cmd_status == "Out of MBM assignable counters"
    # occupancy needs no counter, and a domain must exist
    for line in ("llc_occupancy:0=e", "mbm_total_bytes:7=e", "mbm_total_bytes:0=x"):
        with pytest.raises(OSError) as err:
            kernel.assign(f"{group}/mbm_L3_assignments", line)
        assert err.value.errno == errno.EINVAL
    # the default group gives one back: the group can take it
    kernel.assigned[None].discard(("mbm_total_bytes", 0))
    kernel.assign(f"{group}/mbm_L3_assignments", "mbm_total_bytes:0=e")
    assert (group / "mbm_L3_assignments").read_text() == (
        "mbm_total_bytes:0=e;1=_\nmbm_local_bytes:0=_;1=_\n"
    )

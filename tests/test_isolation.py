"""Core isolation: a pod's exclusive CPUs against the threads that share their cores and
the L3 caches they span, judged from the kernel's cores, the cgroups' cpusets, the
kubelet's CPUs and /proc/stat — in the model alone, and through the exporter on a fake
SMT host with the simulator's kubelet."""

from __future__ import annotations

import shutil
import tempfile
import uuid

import pytest

from numaguard.exporter.model.isolation import core_isolation
from numaguard.exporter.model.placement import Topology, build_topology
from numaguard.exporter.model.zones import aligned_room
from numaguard.exporter.readers import ParseError, format_id_list
from numaguard.exporter.readers.cpu import CpuTime, parse_cpu_times, parse_smt_active
from numaguard.exporter.records import L3Domain
from numaguard.exporter.sources.host import HostSource
from numaguard.exporter.sources.kubelet import PodResourcesSource
from numaguard.simulator.cluster.node import SimNode, SMTAlignmentError, admit, take_by_topology
from numaguard.simulator.fakes.host import (
    GIB,
    KUBELET_CONFIG,
    FakeContainer,
    FakeHost,
    FakeNumaNode,
    FakePod,
)
from numaguard.simulator.fakes.nvml import FakeNvml
from numaguard.simulator.fakes.podresources import FakeKubelet
from tests.conftest import make_collection, metadata_of, samples, series

ALL = frozenset(range(16))
# 2 NUMA nodes of 4 cores x 2 threads: core k of node 0 is CPUs k and k + 4
CORES = {c: frozenset({c, c ^ 4}) for c in range(8)} | {
    c: frozenset({c, c ^ 4}) for c in range(8, 16)
}
NO_SMT = {c: frozenset({c}) for c in ALL}
ONE_L3_A_NODE = {0: L3Domain(0, frozenset(range(8)), 1), 1: L3Domain(1, frozenset(range(8, 16)), 1)}
# two caches a NUMA node: CPUs 0-1 and their siblings 4-5, 2-3 and 6-7, ...
CCX = {
    i: L3Domain(i, frozenset({base, base + 1, base + 4, base + 5}), 1)
    for i, base in enumerate((0, 2, 8, 10))
}


def judged(
    own, elsewhere=(), pool=ALL, allocatable=ALL, cores=None, l3=None, finer=False, times=None
):
    return core_isolation(
        frozenset(own),
        frozenset(elsewhere),
        CORES if cores is None else cores,
        None if pool is None else frozenset(pool) - frozenset(own) - frozenset(elsewhere),
        None if allocatable is None else frozenset(allocatable),
        l3 or {},
        finer,
        times,
    )


def test_whole_cores_share_nothing():
    iso = judged({0, 4, 1, 5})
    assert iso.verdicts == {"smt_shared": False} and iso.shared == {}
    assert iso.sibling_busy is None


def test_an_odd_thread_s_sibling_is_named_by_whose_it_is():
    # 3 CPUs: core 0 whole and CPU 1, whose sibling 5 is in the shared pool ...
    assert judged({0, 4, 1}).shared == {"shared_pool": 1}
    # ... another container's exclusive CPU ...
    iso = judged({0, 4, 1}, elsewhere={5})
    assert iso.verdicts == {"smt_shared": True} and iso.shared == {"exclusive": 1}
    # ... one the kubelet reserved (it is in the shared pool too, but never handed out) ...
    assert judged({0, 4, 1}, allocatable=ALL - {5}).shared == {"reserved": 1}
    # ... or out of the pool though no container read holds it: the CPU manager gave it
    assert judged({0, 4, 1}, pool=ALL - {5}).shared == {"exclusive": 1}


def test_what_cannot_be_known_gets_no_verdict():
    assert "smt_shared" not in judged({0, 1}, cores={0: frozenset({0, 4})}).verdicts
    assert "smt_shared" not in judged({0, 1}, pool=None).verdicts
    assert "smt_shared" not in judged({0, 1}, allocatable=None).verdicts
    # and without SMT no core is shared: the node's numaguard_node_smt_active says so
    assert "smt_shared" not in judged({0, 1}, cores=NO_SMT).verdicts


def test_the_siblings_busy_share_comes_from_proc_stat():
    before = {c: CpuTime(100, 1000) for c in ALL}
    after = {c: CpuTime(100 + (90 if c in (5, 6) else 10), 1100) for c in ALL}
    iso = judged({0, 4, 1, 2}, times=(before, after))  # siblings 5 and 6 are not its own
    assert iso.shared == {"shared_pool": 2}
    assert iso.sibling_busy == pytest.approx(0.9)
    # a CPU whose counters went back (offlined and back) leaves it unknown, never 0
    back = {**after, 6: CpuTime(50, 1100)}
    assert judged({0, 4, 1, 2}, times=(before, back)).sibling_busy is None
    assert (
        judged({0, 4, 1, 2}, times=(before, {c: after[c] for c in ALL - {5}})).sibling_busy is None
    )


def test_l3_span_only_where_caches_are_finer_than_numa_nodes():
    # CPUs 1 and 2 sit in two caches though one holds four CPUs
    iso = judged({1, 2}, l3=CCX, finer=True)
    assert (iso.l3_domains, iso.l3_fewest, iso.verdicts["l3_span"]) == (2, 1, True)
    assert judged({0, 1}, l3=CCX, finer=True).verdicts["l3_span"] is False
    # six CPUs need two caches of four: spanning two is no fault
    assert judged({0, 1, 4, 5, 2, 6}, l3=CCX, finer=True).verdicts["l3_span"] is False
    # one cache a NUMA node: a span of caches is one of nodes, cpu_span's to say
    iso = judged({7, 8}, l3=ONE_L3_A_NODE)
    assert (iso.l3_domains, iso.l3_fewest) == (2, 1) and "l3_span" not in iso.verdicts
    # a CPU in no cache read: nothing said of caches
    assert judged({1, 2}, l3={0: CCX[0]}, finer=True).l3_domains is None


def test_a_zone_s_room_in_whole_cores_and_in_one_cache():
    def topology(cores=CORES, l3=CCX):
        return Topology((0, 1), {c: c // 8 for c in ALL}, {}, {}, l3, cores)

    # node 0 has CPUs 1 and 5 (core 1, whole) and 2 (its sibling 6 is taken) free
    free = frozenset({1, 5, 2, *range(8, 16)})
    assert aligned_room(free, topology()) == ({0: 2, 1: 8}, {0: 2, 1: 4})
    # no SMT: no whole cores to count; one cache a NUMA node: no cache to count
    assert aligned_room(free, topology(NO_SMT, ONE_L3_A_NODE)) == (None, None)
    # a CPU whose core was not read: no count made up
    assert aligned_room(free, topology({c: CORES[c] for c in range(15)}))[0] is None


def test_proc_stat_and_smt_active_are_read_as_the_kernel_writes_them():
    text = (
        "cpu  40 0 20 900 10 0 0 0 0 0\n"
        "cpu0 30 0 10 400 5 0 0 0 7 0\n"
        "cpu1 10 0 10 500 5 0 0 0 0 0\n"
        "intr 12 0\nctxt 99\n"
    )
    # busy: all but idle and iowait; guest time is in user already
    assert parse_cpu_times(text) == {0: CpuTime(40, 445), 1: CpuTime(20, 525)}
    assert parse_cpu_times("cpu0 1 2 3 4\n") == {0: CpuTime(6, 10)}  # 2.4's four fields
    for bad in ("intr 1\n", "cpu0 1 2\n", "cpu0 1 2 3 x\n", "cpu0 1 2 3 4\ncpu0 1 2 3 4\n"):
        with pytest.raises(ParseError):
            parse_cpu_times(bad)
    assert parse_smt_active("1\n") is True and parse_smt_active("0") is False
    with pytest.raises(ParseError):
        parse_smt_active("on")


def test_cores_from_the_older_file_and_bad_ones_said_not_guessed(fake_root):
    root = fake_root(smt_host())
    cpu = root.root / "sys/devices/system/cpu"
    (cpu / "cpu3/topology/core_cpus_list").unlink()  # a kernel before 5.3
    (cpu / "cpu9/topology/core_cpus_list").write_text("9,99\n")  # a CPU not online
    (cpu / "cpu13/topology/core_cpus_list").write_text("thirteen\n")
    (cpu / "smt/active").unlink()  # a kernel without SMT control
    reading = HostSource(str(root.root)).read()
    assert reading.core_of_cpu[3] == reading.core_of_cpu[7] == frozenset({3, 7})
    assert 9 not in reading.core_of_cpu and 13 not in reading.core_of_cpu
    assert reading.core_of_cpu[12] == frozenset({8, 12})  # read from 8, its sibling
    problems = {(i.reason, i.path.split("/")[-3]) for i in reading.issues}
    assert problems == {("parse", "cpu9"), ("parse", "cpu13")}
    assert reading.smt_active is None
    # a core count with CPUs left out would be made up: none is said
    assert build_topology(reading).cpus_per_core is None
    assert build_topology(HostSource(str(fake_root(smt_host()).root)).read()).cpus_per_core == 2


def uid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, name))


def smt_host() -> FakeHost:
    """Two NUMA nodes of 4 cores x 2 threads; CPU 0 reserved. trainer: 3 exclusive
    CPUs, core 1 whole (1, 5) and CPU 2, whose sibling 6 is loader's; loader: CPU 6;
    edge: CPU 4, whose sibling 0 is reserved; web in the shared pool."""
    host = FakeHost(
        [FakeNumaNode("0-7", 0), FakeNumaNode("8-15", 1)],
        threads_per_core=2,
        kubelet_config={"cpuManagerPolicy": "static", "reservedSystemCPUs": "0"},
    )
    host.pods = [
        FakePod(
            "trainer",
            uid("trainer"),
            "guaranteed",
            [FakeContainer("main", "1-2,5", {0: GIB}, exclusive_cpus=True)],
        ),
        FakePod(
            "loader",
            uid("loader"),
            "guaranteed",
            [FakeContainer("main", "6", {0: GIB}, exclusive_cpus=True)],
        ),
        FakePod(
            "edge",
            uid("edge"),
            "guaranteed",
            [FakeContainer("main", "4", {0: GIB}, exclusive_cpus=True)],
        ),
        FakePod("web", uid("web"), "burstable", [FakeContainer("main", "0,3,7-15", {0: GIB})]),
    ]
    return host


async def test_the_exporter_says_whose_sibling_and_how_busy(fake_root):
    host = smt_host()
    host.cpu_ticks = {c: (0, 0) for c in range(16)}
    root = fake_root(host)
    short = tempfile.mkdtemp(prefix="iso", dir="/tmp")
    kubelet = await FakeKubelet(f"{short}/kubelet.sock", host).start()
    source = PodResourcesSource(f"{short}/kubelet.sock", config=str(root.root / KUBELET_CONFIG))
    try:
        collection = make_collection(root, metadata_of(host), kubelet=source, detail=False)
        await collection.run_once()
        # the loader's CPU 6 works 80 % of the interval, the reserved CPU 0 half of it
        busy = {c: 80 if c == 6 else 50 if c == 0 else 5 for c in range(16)}
        host.cpu_ticks = {c: (b, 100 - b) for c, b in busy.items()}
        root.write()
        await collection.run_once()
        got = samples(collection.exposition.text)
    finally:
        source.close()
        await kubelet.stop()
        shutil.rmtree(short, ignore_errors=True)

    def of(name, pod, **labels):
        return got.get(series(name, namespace="default", pod=pod, pod_uid=uid(pod), **labels))

    assert got[series("numaguard_node_smt_active")] == 1
    assert got[series("numaguard_node_cpus_per_core")] == 2
    # node 0's free CPUs are 3 and 7, one whole core; node 1's are all free
    whole = "numaguard_zone_cpus_free_whole_cores"
    assert got[series(whole, numa_node="0")] == 2 and got[series(whole, numa_node="1")] == 8
    assert not [k for k in got if "zone_l3_most_free_cpus" in k]  # one L3 a socket
    info = series("numaguard_kubelet_cpu_manager_info", policy="static", reserved_cpus="0")
    assert got[info] == 1
    assert of("numaguard_pod_core_isolation", "trainer", reason="smt_shared") == 1
    assert of("numaguard_pod_smt_shared_cpus", "trainer", shared_with="exclusive") == 1
    assert of("numaguard_pod_smt_shared_cpus", "trainer", shared_with="shared_pool") == 0
    assert of("numaguard_pod_smt_sibling_busy_ratio", "trainer") == pytest.approx(0.8)
    # the loader's sibling 2 is the trainer's; its core is shared the other way too
    assert of("numaguard_pod_core_isolation", "loader", reason="smt_shared") == 1
    assert of("numaguard_pod_smt_sibling_busy_ratio", "loader") == pytest.approx(0.05)
    # the edge's sibling 0 is the kubelet's reserved CPU, busy half the time
    assert of("numaguard_pod_smt_shared_cpus", "edge", shared_with="reserved") == 1
    assert of("numaguard_pod_smt_shared_cpus", "edge", shared_with="shared_pool") == 0
    assert of("numaguard_pod_smt_sibling_busy_ratio", "edge") == pytest.approx(0.5)
    # a pod in the shared pool gets no verdict: the pool spans the node by design
    assert of("numaguard_pod_core_isolation", "web", reason="smt_shared") is None
    # one L3 a socket: caches are cpu_span's to judge, no l3_span
    assert of("numaguard_pod_core_isolation", "trainer", reason="l3_span") is None


async def test_the_kubelet_s_cpu_manager_as_its_config_says(fake_root, caplog):
    """Its policy, reserved CPUs and options as written, a UTF-8 comment and all; a node
    without the file, or with one the kubelet would refuse, says nothing of them, says
    why once in the log, and fails no collector: the PodResources answers stand."""
    host = smt_host()
    host.kubelet_config["cpuManagerPolicyOptions"] = {
        "full-pcpus-only": "true",
        "prefer-align-cpus-by-uncorecache": "false",
    }
    root = fake_root(host)
    config = root.root / KUBELET_CONFIG
    short = tempfile.mkdtemp(prefix="iso", dir="/tmp")
    kubelet = await FakeKubelet(f"{short}/kubelet.sock", host).start()
    source = PodResourcesSource(f"{short}/kubelet.sock", config=str(config))
    collection = make_collection(root, metadata_of(host), kubelet=source, detail=False)

    async def cycle(comment: str = "") -> dict:
        root.write()
        if comment:
            config.write_text(f"# {comment}\n" + config.read_text(), encoding="utf-8")
        await collection.run_once()
        got = samples(collection.exposition.text)
        assert got[series("numaguard_collector_success", collector="pod_resources")] == 1
        return got

    def options(got) -> dict[str, str]:
        return {
            dict(k)["option"]: dict(k)["setting"]
            for (n, k), v in got.items()
            if n == "numaguard_kubelet_cpu_manager_option" and v == 1
        }

    def unread(got) -> bool:
        return not [n for n, _ in got if n.startswith("numaguard_kubelet_cpu_manager")]

    try:
        got = await cycle("réglé à la main")
        assert options(got) == {
            "full-pcpus-only": "true",
            "prefer-align-cpus-by-uncorecache": "false",
        }
        # changed, its size the same: read again all the same
        host.kubelet_config["cpuManagerPolicyOptions"]["full-pcpus-only"] = "fals"
        assert options(await cycle("réglé à la main"))["full-pcpus-only"] == "fals"
        host.kubelet_config = None  # kept elsewhere on this node
        assert unread(await cycle())
        # an unquoted true: the kubelet's map of strings refuses it, and so do we
        host.kubelet_config = {"cpuManagerPolicyOptions": {"full-pcpus-only": True}}
        assert unread(await cycle())
        assert unread(await cycle())
        said = [r.getMessage() for r in caplog.records if "kubelet config" in r.getMessage()]
        assert len(said) == 2, said  # once for each thing wrong
        assert said[0].startswith("no kubelet config at") and "left unread" in said[1]
    finally:
        source.close()
        await kubelet.stop()
        shutil.rmtree(short, ignore_errors=True)


def sim_node(reserved: str = "0") -> SimNode:
    """Two NUMA nodes of 4 cores x 2 threads (core k of node 0: CPUs k and k + 4) under
    single-numa-node."""
    host = FakeHost(
        [FakeNumaNode("0-7", 0), FakeNumaNode("8-15", 1)],
        threads_per_core=2,
        kubelet_config={
            "cpuManagerPolicy": "static",
            "reservedSystemCPUs": reserved,
        },
    )
    return SimNode("sim", host, FakeNvml(), "single-numa-node")


def admitted(node: SimNode, need: int) -> frozenset[int]:
    cpus, _ = admit(node, need, {})
    container = FakeContainer("c", format_id_list(cpus), exclusive_cpus=True)
    node.host.pods.append(FakePod(f"p{len(node.host.pods)}", "u", "guaranteed", [container]))
    return cpus


def test_the_simulated_kubelet_takes_whole_cores_first_then_the_fullest_cores_threads():
    node = sim_node()
    # core 1 whole, then the thread beside the reserved CPU 0
    assert admitted(node, 3) == {1, 5, 4}
    # one thread: of the emptiest cores, the lowest; the next fills its core
    assert admitted(node, 1) == {2}
    assert admitted(node, 1) == {6}
    # without SMT the lowest free CPUs, as before
    assert take_by_topology([3, 1, 2], {c: frozenset({c}) for c in range(4)}, 2) == [1, 2]


def test_full_pcpus_only_refuses_what_whole_cores_cannot_hold_in_the_kubelet_s_words():
    node = sim_node()
    node.host.kubelet_config["cpuManagerPolicyOptions"] = {"full-pcpus-only": "true"}
    with pytest.raises(SMTAlignmentError) as refused:
        admit(node, 3, {})
    assert str(refused.value) == (
        "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2"
    )
    assert admitted(node, 4) == {1, 5, 2, 6}
    # the reserved CPUs' siblings (4, 5) count as taken, node-wide: with node 1 full,
    # only core 3 is whole and free
    node = sim_node(reserved="0,1")
    node.host.kubelet_config["cpuManagerPolicyOptions"] = {"full-pcpus-only": "1"}
    assert admitted(node, 8) == set(range(8, 16))
    assert admitted(node, 2) == {2, 6}
    with pytest.raises(SMTAlignmentError, match="available physical CPUs = 2, requested CPUs = 4"):
        admit(node, 4, {})

"""Moving a pod's memory in place (exporter/memory_mover.py, exporter/mover/): the readers
of a process's mappings, the choice of node, the pace, the move itself, and the helper
that alone holds the capability, over its real socket — against this machine's kernel
where one NUMA node is enough, against the fake host's move_pages elsewhere. The two-node
proof on a real kernel is tests/test_node_vm.py's and tests/test_kubenode_loop.py's."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import errno
import mmap
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from numaguard.exporter import cli as exporter_cli
from numaguard.exporter.mover import pages as mover_pages
from numaguard.exporter.mover import wire
from numaguard.exporter.mover.helper import Helper
from numaguard.exporter.mover.helper import main as helper_cli
from numaguard.exporter.mover.orders import REQUEST_TTL_SECONDS, MemoryMover, destination
from numaguard.exporter.mover.pages import (
    BATCH_BYTES,
    SCAN_PAGES,
    Kernel,
    KernelRefused,
    Pace,
    move_pod_memory,
)
from numaguard.exporter.readers import ParseError
from numaguard.exporter.readers.numa import ProcessMapping, parse_process_mappings
from numaguard.exporter.server import Exporter
from numaguard.exporter.settings import Settings
from numaguard.exporter.sources.kube import pod_meta
from numaguard.exporter.sources.kubelet import PodResourcesSource
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import (
    GIB,
    HEAP,
    MIB,
    FakeContainer,
    FakeHost,
    FakeNumaNode,
    FakePod,
)
from numaguard.simulator.fakes.pages import FakePages
from numaguard.simulator.fakes.podresources import FakeKubelet
from numaguard.simulator.parts.processes import until
from tests.conftest import make_collection, metadata_of, samples, series

ROOT = Path(__file__).resolve().parent.parent
PAGE = 4096
REMOTE_MIB = 112


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def host_with_remote_memory() -> FakeHost:
    """A pod whose exclusive CPUs sit on node 0 and most of whose memory is on node 1,
    beside one in the shared pool."""
    return FakeHost(
        nodes=[
            FakeNumaNode("0-7", socket=0, memory_total_bytes=GIB, memory_free_bytes=GIB // 2),
            FakeNumaNode("8-15", socket=1, memory_total_bytes=GIB, memory_free_bytes=GIB // 2),
        ],
        pods=[
            FakePod(
                "remote",
                presets.pod_uid("remote"),
                "guaranteed",
                [FakeContainer("main", "2-3", {0: 16 * MIB, 1: REMOTE_MIB * MIB})],
                namespace="ml",
            ),
            # the shared pool, as the static CPU manager leaves it
            FakePod(
                "web",
                presets.pod_uid("web"),
                "burstable",
                [FakeContainer("main", "0-1,4-15", {0: 32 * MIB})],
                namespace="ml",
            ),
        ],
        process_maps=True,
    )


def remote_verdict(host: FakeHost):
    """The remote pod's memory_remote verdict, as the samples of an exposition name it."""
    pod = host.pods[0]
    return series(
        "numaguard_pod_cross_numa",
        namespace=pod.namespace,
        pod=pod.name,
        pod_uid=pod.uid,
        reason="memory_remote",
    )


# -- this machine's kernel ---------------------------------------------------------


def touched_page() -> tuple[mmap.mmap, int]:
    """A private anonymous page of this process, written to (so resident), and its address."""
    area = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    area[0:1] = b"\x01"
    return area, ctypes.addressof(ctypes.c_char.from_buffer(area))


def test_this_process_s_mappings_are_where_the_kernel_says():
    area, address = touched_page()
    with open("/proc/self/maps") as f, open("/proc/self/numa_maps") as g:
        mappings = parse_process_mappings(f.read(), g.read())
    (ours,) = [m for m in mappings if m.start <= address < m.end]
    assert ours.page_size == PAGE and sum(ours.pages.values()) >= 1
    kernel = Kernel()
    (node,) = kernel.move_pages(os.getpid(), [address], None)
    assert node in ours.pages  # the node numa_maps counts it on
    # moving it to the node it is on: there it stays
    assert kernel.move_pages(os.getpid(), [address], node) == [node]
    # a page not mapped at all, and a node that is not online
    assert kernel.move_pages(os.getpid(), [PAGE], None) == [-errno.EFAULT]
    online = {int(n[4:]) for n in os.listdir("/sys/devices/system/node") if n[4:].isdigit()}
    offline = max(online) + 1
    with pytest.raises(KernelRefused) as refused:
        kernel.move_pages(os.getpid(), [address], offline)
    assert refused.value.errno == errno.ENODEV
    area.close()


def test_a_process_that_is_gone_is_esrch():
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its PID names no process now
    with pytest.raises(KernelRefused) as refused:
        Kernel().move_pages(gone.pid, [HEAP], None)
    assert refused.value.errno == errno.ESRCH


# -- readers -----------------------------------------------------------------------


def test_mappings_join_maps_and_numa_maps():
    maps = (
        "7f0000000000-7f0000100000 rw-p 00000000 00:00 0\n"
        "7f2000000000-7f2000400000 rw-s 00000000 00:0f 42 /dev/hugepages/x\n"
        "7f3000000000-7f3000001000 r--p 00000000 00:00 0\n"
    )
    numa_maps = (
        "7f0000000000 default anon=200 dirty=200 N0=56 N1=144 kernelpagesize_kB=4\n"
        "7f2000000000 bind:1 file=/dev/hugepages/x huge dirty=2 N1=2 kernelpagesize_kB=2048\n"
        "7f3000000000 default\n"  # nothing resident: left out
        "7f9000000000 default anon=1 N0=1 kernelpagesize_kB=4\n"  # gone from maps meanwhile
    )
    assert parse_process_mappings(maps, numa_maps) == (
        ProcessMapping(0x7F0000000000, 0x7F0000100000, PAGE, {0: 56, 1: 144}),
        ProcessMapping(0x7F2000000000, 0x7F2000400000, 2 << 20, {1: 2}),
    )


@pytest.mark.parametrize(
    ("maps", "numa_maps"),
    [
        ("not a range\n", ""),
        ("7f0000001000-7f0000000000 rw-p 0 0:0 0\n", ""),
        ("7f0000000000-7f0000001000 rw-p 0 0:0 0\n", "zz default N0=1\n"),
        ("7f0000000000-7f0000001000 rw-p 0 0:0 0\n", "7f0000000000 N0=1 kernelpagesize_kB=3\n"),
        ("7f0000000000-7f0000001000 rw-p 0 0:0 0\n", "7f0000000000 N99999=1\n"),
    ],
)
def test_mappings_that_are_not_the_kernel_s_are_refused(maps, numa_maps):
    with pytest.raises(ParseError):
        parse_process_mappings(maps, numa_maps)


# -- where to, and how fast --------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu_nodes", "mems", "free", "pinned", "expected"),
    [
        ({0}, {0, 1}, {0: 1 * GIB, 1: 0}, (), (0, "")),
        ({0, 1}, {0, 1}, {0: GIB, 1: 2 * GIB}, (), (1, "")),  # the roomier of its CPUs' nodes
        ({0}, {1}, {0: GIB, 1: GIB}, (), (None, "mems")),  # its cpuset.mems does not allow it
        ({0}, {0, 1}, {0: GIB, 1: GIB}, (1,), (None, "memory_manager")),
        ({0, 1}, {0, 1}, {0: GIB, 1: GIB}, (1,), (1, "")),  # within the pinning
        ({0}, {0, 1}, {0: 64 * MIB, 1: GIB}, (), (None, "no_free_memory")),
    ],
)
def test_the_destination_is_one_of_its_cpus_nodes_with_room(
    cpu_nodes, mems, free, pinned, expected
):
    assert destination(cpu_nodes, mems, free, 128 * MIB, pinned) == expected


def test_the_pace_never_runs_ahead_of_the_rate():
    clock = FakeClock()
    pace = Pace(10 * MIB, clock, clock.sleep)
    pace.after(5 * MIB)
    assert clock.now - 1000 == pytest.approx(0.5)
    clock.now += 2.0  # a slow batch: no sleep owed
    pace.after(10 * MIB)
    assert clock.slept == [pytest.approx(0.5)]
    with pytest.raises(ValueError):
        Pace(0, clock, clock.sleep)


# -- the move ----------------------------------------------------------------------


def moving(host: FakeHost, fake_root, pages: FakePages, node: int = 0, rate: float = 64 * MIB):
    root = fake_root(host)
    clock = FakeClock()
    pod = host.pods[0]
    moved = move_pod_memory(
        [str(root.pod_cgroup(pod))],
        pod.uid,
        node,
        Pace(rate, clock, clock.sleep),
        pages,
        proc=str(root.root / "proc"),
    )
    return root, moved


async def test_the_pod_s_far_memory_moves_to_its_cpus_node_at_the_rate(fake_root):
    host = host_with_remote_memory()
    root = fake_root(host)
    collection = make_collection(root, metadata=metadata_of(host))
    await collection.run_once()
    verdict = remote_verdict(host)
    assert samples(collection.exposition.text)[verdict] == 1
    free_before = [n.memory_free_bytes for n in host.nodes]
    pages = FakePages(host)
    root, moved = moving(host, fake_root, pages, rate=64 * MIB)
    far = REMOTE_MIB * MIB
    assert (moved.pages, moved.bytes, moved.processes) == (far // PAGE, far, 1)
    assert not moved.failures and not moved.stopped
    assert host.pods[0].containers[0].memory_by_node == {0: (16 + REMOTE_MIB) * MIB, 1: 0}
    assert [n.memory_free_bytes for n in host.nodes] == [
        free_before[0] - far,
        free_before[1] + far,
    ]
    # no faster than the rate, and not slower either (the fake kernel takes no time)
    assert moved.seconds == pytest.approx(far / (64 * MIB))
    # the heap asked where its pages are, SCAN_PAGES at a time, then moved a batch at a
    # time, the rate checked after each; libc's pages, on node 0 already, not even asked
    span = SCAN_PAGES * PAGE  # chunks aligned in memory: the unaligned heap takes one more
    scans = (HEAP + 128 * MIB - 1) // span - HEAP // span + 1
    assert pages.calls == scans + far // BATCH_BYTES
    # what the exporter sees next: the memory at home, the verdict gone
    root.write()
    await collection.run_once()
    assert samples(collection.exposition.text)[verdict] == 0


def test_huge_pages_move_whole_and_each_page_counts_once(fake_root):
    host = host_with_remote_memory()
    pages = FakePages(host, folio_pages=512)  # 2 MiB transparent huge pages
    _, moved = moving(host, fake_root, pages)
    far = REMOTE_MIB * MIB
    assert (moved.bytes, moved.pages, dict(moved.failures)) == (far, far // PAGE, {})
    assert host.pods[0].containers[0].memory_by_node == {0: (16 + REMOTE_MIB) * MIB, 1: 0}


def test_memory_on_any_of_its_cpus_nodes_stays_where_it_is(fake_root):
    host = host_with_remote_memory()
    host.nodes.append(FakeNumaNode("16-23", socket=2, memory_total_bytes=GIB))
    ctr = host.pods[0].containers[0]
    ctr.cpus, ctr.memory_by_node = "6-9", {0: 16 * MIB, 1: 32 * MIB, 2: 64 * MIB}
    root = fake_root(host)
    clock = FakeClock()
    moved = move_pod_memory(
        [str(root.pod_cgroup(host.pods[0]))],
        host.pods[0].uid,
        0,
        Pace(64 * MIB, clock, clock.sleep),
        FakePages(host),
        proc=str(root.root / "proc"),
        home=(0, 1),  # its CPUs span nodes 0 and 1
    )
    assert moved.bytes == 64 * MIB
    assert ctr.memory_by_node == {0: 80 * MIB, 1: 32 * MIB, 2: 0}


def test_a_library_page_shared_with_others_stays(fake_root):
    host = host_with_remote_memory()
    _, moved = moving(host, fake_root, FakePages(host), node=1)
    assert moved.bytes == 16 * MIB  # its heap's node-0 pages
    assert moved.failures == {"EACCES": 2}  # libc's two pages, mapped by every process
    assert not moved.stopped


def test_without_ptrace_access_nothing_moves(fake_root):
    host = host_with_remote_memory()
    _, moved = moving(host, fake_root, FakePages(host, ptrace=False))
    assert (moved.bytes, moved.stopped, moved.failures) == (0, "EPERM", {"EPERM": 1})
    assert host.pods[0].containers[0].memory_by_node[1] == REMOTE_MIB * MIB


def test_a_node_outside_its_cpuset_mems_is_refused_by_the_kernel(fake_root):
    host = host_with_remote_memory()
    host.pods[0].containers[0].mems = "1"
    _, moved = moving(host, fake_root, FakePages(host))
    assert (moved.bytes, moved.stopped) == (0, "EACCES")


def test_a_full_node_takes_what_it_has_room_for(fake_root):
    host = host_with_remote_memory()
    host.nodes[0].memory_free_bytes = 1 * MIB
    _, moved = moving(host, fake_root, FakePages(host))
    assert moved.bytes == 1 * MIB
    assert moved.failures == {"ENOMEM": (REMOTE_MIB - 1) * MIB // PAGE}


def test_a_process_that_is_not_the_pod_s_is_left_alone(fake_root):
    host = host_with_remote_memory()
    root = fake_root(host)
    pid = host.pid(host.pods[0], host.pods[0].containers[0])
    # the PID was reused by a process of another pod between cgroup.procs and its move
    other = presets.pod_uid("other").replace("-", "_")
    cgroup = f"0::/kubepods.slice/kubepods-pod{other}.slice/cri-containerd-{'c' * 64}.scope\n"
    (root.root / f"proc/{pid}/cgroup").write_text(cgroup)
    clock = FakeClock()
    pages = FakePages(host)
    moved = move_pod_memory(
        [str(root.pod_cgroup(host.pods[0]))],
        host.pods[0].uid,
        0,
        Pace(64 * MIB, clock, clock.sleep),
        pages,
        proc=str(root.root / "proc"),
    )
    assert (moved.bytes, moved.processes, moved.failures) == (0, 0, {"not_the_pod": 1})
    assert pages.calls == 0


# -- requests, as the exporter's --memory-mover carries them out -------------------


@pytest.fixture
async def node_with_kubelet(fake_root, tmp_path_factory):
    """The remote pod's node, its kubelet answering PodResources, a collection over both
    and the pod's metadata: ``(host, root, collection, metadata)``; ``metadata`` is a
    dict to put requests in."""
    host = host_with_remote_memory()
    host.pods[0].containers[0].exclusive_cpus = True
    root = fake_root(host)
    socket = str(tmp_path_factory.mktemp("kubelet", numbered=True) / "kubelet.sock")
    kubelet = await FakeKubelet(socket, host).start()
    source = PodResourcesSource(socket)
    metadata = dict(metadata_of(host))
    collection = make_collection(root, metadata=metadata, kubelet=source)
    yield host, root, collection, metadata
    source.close()
    await kubelet.stop()


def asking(metadata: dict, host: FakeHost, request: str) -> None:
    uid = host.pods[0].uid
    metadata[uid] = dataclasses.replace(metadata[uid], move_memory=request)


@pytest.fixture
def helper_at(tmp_path_factory):
    """``helper_at(helper)``: the exporter's client of ``helper``, which serves on a real
    Unix socket in a thread until the test ends."""
    running = []

    def start(helper: Helper) -> wire.HelperClient:
        path = str(tmp_path_factory.mktemp("mover", numbered=True) / "mover.sock")
        server = helper.serve(path)
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        running.append((helper, server, thread))
        return wire.HelperClient(path)

    yield start
    for helper, server, thread in running:
        helper.stop()
        server.shutdown()
        thread.join()
        server.server_close()


@pytest.fixture
def mover_for(helper_at):
    """``mover_for(host, root, pages, helper)``: the exporter's mover and its helper, by
    default one moving through ``pages`` at 64 MiB/s of a fake clock."""

    def make(
        host: FakeHost, root, pages: FakePages | None = None, helper: Helper | None = None
    ) -> MemoryMover:
        clock = FakeClock()
        if helper is None:
            helper = Helper(str(root.root), 64 * MIB, pages or FakePages(host), clock, clock.sleep)
        return MemoryMover(helper_at(helper))

    return make


async def test_a_request_is_carried_out_once_and_shown(node_with_kubelet, mover_for):
    host, root, collection, metadata = node_with_kubelet
    mover = mover_for(host, root)
    collection.moves = lambda: mover.totals
    await collection.run_once()
    assert mover.carry_out(collection.snapshot, metadata) == []  # nobody asked
    asking(metadata, host, "evict-1")
    await collection.run_once()
    far = REMOTE_MIB * MIB
    (done,) = mover.carry_out(collection.snapshot, metadata)
    assert done == {
        "namespace": "ml",
        "pod": "remote",
        "pod_uid": host.pods[0].uid,
        "request": "evict-1",
        "far_bytes": far,
        "result": "moved",
        "reason": "",
        "numa_node": 0,
        "bytes": far,
        "pages": far // PAGE,
        "seconds": 1.75,
        "failures": {},
    }
    assert mover.carry_out(collection.snapshot, metadata) == []  # once
    root.write()
    await collection.run_once()
    got = samples(collection.exposition.text)
    assert got[series("numaguard_memory_moves_total", result="moved")] == 1
    assert got[series("numaguard_memory_moves_total", result="refused")] == 0
    assert got[series("numaguard_memory_moved_bytes_total")] == far
    assert got[series("numaguard_memory_moved_pages_total")] == far // PAGE
    assert got[series("numaguard_memory_move_seconds_total")] == 1.75
    verdict = remote_verdict(host)
    assert got[verdict] == 0
    # a new request, with nothing left to move
    asking(metadata, host, "evict-2")
    (again,) = mover.carry_out(collection.snapshot, metadata)
    assert (again["result"], again["reason"]) == ("refused", "nothing_remote")


async def test_a_request_of_long_ago_is_not_carried_out(node_with_kubelet, mover_for):
    """The remediator's requests are Unix times: one seen first over 10 minutes later (an
    exporter restarted long after it) is refused, and a new one is carried out."""
    host, root, collection, metadata = node_with_kubelet
    pages = FakePages(host)
    mover = mover_for(host, root, pages)
    mover.wall = lambda: 1_800_000_000.0
    await collection.run_once()
    asking(metadata, host, str(1_800_000_000 - 601))
    (done,) = mover.carry_out(collection.snapshot, metadata)
    assert (done["result"], done["reason"]) == ("refused", "expired") and pages.calls == 0
    asking(metadata, host, str(1_800_000_000 - 600))
    (done,) = mover.carry_out(collection.snapshot, metadata)
    assert done["result"] == "moved" and done["bytes"] == REMOTE_MIB * MIB


async def test_a_move_stops_after_its_batch_when_the_exporter_ends(node_with_kubelet, mover_for):
    """Told to stop mid-move (SIGTERM), it stops after the batch under way and says so;
    the request stays on the pod, and the next exporter carries it on."""
    host, root, collection, metadata = node_with_kubelet
    asking(metadata, host, "evict-1")
    await collection.run_once()
    clock = FakeClock()

    def stopped_while_waiting(seconds: float) -> None:
        clock.sleep(seconds)
        mover.stop()  # the exporter half-closes; the helper hears it before its next call
        assert helper.current is not None and helper.current.wait(30)

    helper = Helper(str(root.root), 64 * MIB, FakePages(host), clock, stopped_while_waiting)
    mover = mover_for(host, root, helper=helper)
    (done,) = mover.carry_out(collection.snapshot, metadata)
    batch = BATCH_BYTES
    assert (done["result"], done["reason"], done["bytes"]) == ("partial", "shutdown", batch)
    assert host.pods[0].containers[0].memory_by_node[1] == REMOTE_MIB * MIB - batch
    assert mover.carry_out(collection.snapshot, metadata) == []  # nothing more once stopped
    root.write()
    await collection.run_once()
    (rest,) = mover_for(host, root).carry_out(collection.snapshot, metadata)
    assert (rest["result"], rest["bytes"]) == ("moved", REMOTE_MIB * MIB - batch)
    assert host.pods[0].containers[0].memory_by_node[1] == 0


async def test_a_move_its_helper_cut_short_is_carried_on(node_with_kubelet, helper_at):
    """The helper's container restarts mid-move (SIGTERM, then a new one): the exporter,
    which goes on, asks again until the new helper has moved the rest."""
    host, root, collection, metadata = node_with_kubelet
    asking(metadata, host, "evict-1")
    await collection.run_once()
    clock = FakeClock()

    def ended_while_waiting(seconds: float) -> None:
        clock.sleep(seconds)
        ending.stop()

    ending = Helper(str(root.root), 64 * MIB, FakePages(host), clock, ended_while_waiting)
    mover = MemoryMover(helper_at(ending))
    (cut,) = mover.carry_out(collection.snapshot, metadata)
    assert (cut["result"], cut["reason"], cut["bytes"]) == ("partial", "shutdown", BATCH_BYTES)
    (gone,) = mover.carry_out(collection.snapshot, metadata)
    assert (gone["result"], gone["reason"]) == ("refused", "no_helper")
    assert mover.carry_out(collection.snapshot, metadata) == []  # said once
    mover.helper = helper_at(Helper(str(root.root), 64 * MIB, FakePages(host), clock, clock.sleep))
    root.write()
    await collection.run_once()
    (rest,) = mover.carry_out(collection.snapshot, metadata)
    assert (rest["result"], rest["bytes"]) == ("moved", REMOTE_MIB * MIB - BATCH_BYTES)
    assert mover.totals.results == {"partial": 1, "refused": 1, "moved": 1}


async def test_the_exporter_s_shutdown_waits_only_for_the_batch_under_way(
    node_with_kubelet, mover_for
):
    """At the rate given, this move would take an hour; closing the exporter stops it
    after its first batch, its wait for the rate cut short."""
    host, root, collection, metadata = node_with_kubelet
    asking(metadata, host, "evict-1")
    await collection.run_once()
    pages = FakePages(host)
    helper = Helper(str(root.root), REMOTE_MIB * MIB / 3600, pages)  # real clock, sleep
    mover = mover_for(host, root, helper=helper)
    exporter = Exporter(Settings(), collection, mover=mover)
    exporter._move()
    await until(lambda: asyncio.sleep(0, pages.calls), "the move under way", timeout=30)
    await asyncio.wait_for(exporter.close(), 60)
    assert mover.totals.results == {"partial": 1} and mover.totals.bytes == BATCH_BYTES


def _shared_pool(host, root, collection, metadata):
    host.pods[0].containers[0].exclusive_cpus = False
    host.pods[0].qos_class = "burstable"  # in the shared pool: no home of its own


def _mems_elsewhere(host, root, collection, metadata):
    host.pods[0].containers[0].mems = "1"


def _pinned_elsewhere(host, root, collection, metadata):
    host.pods[0].containers[0].memory_pinned = (1,)


def _node_full(host, root, collection, metadata):
    host.nodes[0].memory_free_bytes = 64 * MIB


def _kubelet_silent(host, root, collection, metadata):
    del collection.sources["pod_resources"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_shared_pool, "not_exclusive"),
        (_mems_elsewhere, "mems"),
        (_pinned_elsewhere, "memory_manager"),
        (_node_full, "no_free_memory"),
        (_kubelet_silent, "kubelet"),
    ],
)
async def test_a_request_without_a_home_to_move_to_is_refused(
    node_with_kubelet, change, reason, mover_for
):
    host, root, collection, metadata = node_with_kubelet
    change(host, root, collection, metadata)
    root.write()
    asking(metadata, host, "evict-1")
    pages = FakePages(host)
    mover = mover_for(host, root, pages)
    await collection.run_once()
    (done,) = mover.carry_out(collection.snapshot, metadata)
    assert (done["result"], done["reason"]) == ("refused", reason)
    assert pages.calls == 0 and mover.totals.refusals == {reason: 1}
    assert host.pods[0].containers[0].memory_by_node[1] == REMOTE_MIB * MIB


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({"numaguard.io/move-memory": "evict-1"}, "evict-1"),
        ({"numaguard.io/move-memory": "2026-12-04T15:30:00Z.7"}, "2026-12-04T15:30:00Z.7"),
        ({}, ""),
        (None, ""),
        # not a request: left alone, as if absent
        ({"numaguard.io/move-memory": ""}, ""),
        ({"numaguard.io/move-memory": "x" * 64}, ""),
        ({"numaguard.io/move-memory": "a\nb"}, ""),
        ({"numaguard.io/move-memory": 7}, ""),
    ],
)
def test_the_request_is_the_annotation_s_value_when_it_is_one(annotations, expected):
    pod = {"metadata": {"uid": "u1", "namespace": "ml", "name": "remote"}}
    if annotations is not None:
        pod["metadata"]["annotations"] = annotations
    uid, meta = pod_meta(pod)
    assert (uid, meta.move_memory) == ("u1", expected)


def test_the_mover_s_flags_are_checked_before_anything_starts(tmp_path, monkeypatch, capsys):
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    with pytest.raises(SystemExit) as exited:
        exporter_cli.main(["--memory-mover", "--host-root", str(tmp_path)])
    assert exited.value.code == 2
    assert "--memory-mover needs the API server" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        helper_cli(["--rate", "0"])
    assert exited.value.code == 2
    assert "--rate: must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        exporter_cli.main(["--memory-mover.rate", "1000"])
    assert exited.value.code == 2
    assert "the memory mover's helper's now: its --rate" in capsys.readouterr().err


# -- the one capability it takes ----------------------------------------------------

PROBE = """
import errno, sys
from numaguard.exporter.mover.pages import Kernel, KernelRefused
pid = int(sys.argv[1])
try:
    open(f"/proc/{pid}/numa_maps").read()
    print("maps read")
except PermissionError:
    print("maps EACCES")
try:
    Kernel().move_pages(pid, [0x10000], None)
    print("move_pages answered")
except KernelRefused as e:
    print("move_pages", errno.errorcode[e.errno])
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="runs as root with one capability")
@pytest.mark.parametrize(
    ("cap", "expected"),
    [
        ("sys_nice", {"maps": "EACCES", "move_pages": "EPERM"}),
        ("sys_ptrace", {"maps": "read", "move_pages": "answered"}),
    ],
)
def test_another_user_s_pages_take_cap_sys_ptrace_not_cap_sys_nice(cap, expected):
    """This machine's kernel: a pod's process (root, every capability) and the mover's
    helper as its container runs it (uid 0, every capability dropped but the one it
    adds)."""
    target = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        caps = f"-all,+{cap}"
        ran = subprocess.run(
            [
                *("setpriv", f"--bounding-set={caps}", "--inh-caps=-all", "--ambient-caps=-all"),
                *(sys.executable, "-c", PROBE, str(target.pid)),
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
    finally:
        target.kill()
        target.wait()
    assert dict(line.split() for line in ran.stdout.splitlines()) == expected


def test_pages_numa_balancing_hid_from_move_pages_are_counted_not_moved(fake_root):
    """Debian's Linux 6.1 with NUMA balancing on answers ENOENT for a page marked for a
    hinting fault, though numa_maps shows it (measured in the node VM): those pages are
    counted as failures by that errno, never as moved."""
    host = host_with_remote_memory()
    pages = FakePages(host, hinted=1)
    _, moved = moving(host, fake_root, pages)
    assert (moved.pages, moved.bytes) == (0, 0)
    assert moved.failures == {"ENOENT": REMOTE_MIB * MIB // PAGE}
    assert host.pods[0].containers[0].memory_by_node[1] == REMOTE_MIB * MIB


# -- what one tenant process could do to the mover (seen, each) -------------------------


def test_a_reservation_untouched_but_for_a_far_page_costs_a_chunk_not_a_scan(fake_root):
    """0.25 TiB reserved (MAP_NORESERVE) with one far page at its end: the mover asked
    about all 64 Mi of its addresses, 16,386 calls at full CPU. Now the densest mapping
    goes first and moves whole; the reservation is asked about one chunk, its page
    counted unfound."""
    host = host_with_remote_memory()
    host.pods[0].containers[0].reserved = (256 * GIB, 1)
    pages = FakePages(host)
    _, moved = moving(host, fake_root, pages)
    far = REMOTE_MIB * MIB
    assert (moved.bytes, dict(moved.failures)) == (far, {"scan_limit": 1})
    span = SCAN_PAGES * PAGE
    heap_scans = (HEAP + 128 * MIB - 1) // span - HEAP // span + 1
    assert pages.calls == heap_scans + far // BATCH_BYTES + 1


def test_a_stop_is_heard_between_any_two_calls_scans_included(fake_root):
    """Seen: 14.5 s from SIGTERM to the end of a scan that moved nothing (the pace was
    asked only after moves). Told to stop, it makes no call after the one under way."""
    host = host_with_remote_memory()
    root = fake_root(host)
    clock, stopping = FakeClock(), threading.Event()
    pages = FakePages(host)
    pod = host.pods[0]

    class Stopping:
        def move_pages(self, pid, addresses, node):
            stopping.set()  # SIGTERM, during the first call
            return pages.move_pages(pid, addresses, node)

    moved = move_pod_memory(
        [str(root.pod_cgroup(pod))],
        pod.uid,
        0,
        Pace(64 * MIB, clock, clock.sleep, stopping),
        Stopping(),
        proc=str(root.root / "proc"),
    )
    assert (moved.stopped, moved.bytes, pages.calls) == ("shutdown", 0, 1)


def test_hugetlb_pages_are_batched_by_bytes_paced_each_and_bounded_by_the_pool(fake_root):
    """Seen: one call moved 256 GiB of 1 GiB pages before the first rate check (batches
    were counted in pages); and hugetlb pages are in no memory.numa_stat figure the free
    memory check judged by. Of 2 MiB pages, each call moves one, the rate checked after
    it; and no more than the destination's pool has free."""
    host = host_with_remote_memory()
    host.page_size = 2 * MIB
    huge = REMOTE_MIB * MIB // (2 * MIB)  # far pages
    host.nodes[0].free_hugepages = {2 * MIB: huge - 16}
    root = fake_root(host)
    clock, pages, pod = FakeClock(), FakePages(host), host.pods[0]
    rate = 64 * MIB
    moved = move_pod_memory(
        [str(root.pod_cgroup(pod))],
        pod.uid,
        0,
        Pace(rate, clock, clock.sleep),
        pages,
        proc=str(root.root / "proc"),
        sys=str(root.root / "sys"),
    )
    assert (moved.pages, dict(moved.failures)) == (huge - 16, {"no_free_hugepages": 16})
    assert host.nodes[0].free_hugepages == {2 * MIB: 0}
    assert len(clock.slept) == huge - 16
    assert max(clock.slept) == pytest.approx(2 * MIB / rate)


async def test_a_transient_refusal_is_asked_again_until_the_request_expires(
    node_with_kubelet, mover_for
):
    """Seen: a request refused while the kubelet's socket restarted was handled for good,
    and the pod evicted later — the restart the mover exists to avoid. Now it is asked
    again each cycle (said once), carried out once the kubelet answers, and refused
    `expired` if it never does within the request's time."""
    host, root, collection, metadata = node_with_kubelet
    kubelet = collection.sources.pop("pod_resources")
    asking(metadata, host, "evict-1")
    wall = [1000.0]
    mover = mover_for(host, root)
    mover.wall = lambda: wall[0]
    await collection.run_once()
    (first,) = mover.carry_out(collection.snapshot, metadata)
    assert (first["result"], first["reason"]) == ("refused", "kubelet")
    wall[0] += 60
    assert mover.carry_out(collection.snapshot, metadata) == []  # asked again, said once
    collection.sources["pod_resources"] = kubelet
    await collection.run_once()
    (done,) = mover.carry_out(collection.snapshot, metadata)
    assert (done["result"], done["bytes"]) == ("moved", REMOTE_MIB * MIB)
    # another request, never answered by the kubelet: expired once its time is up
    del collection.sources["pod_resources"]
    asking(metadata, host, "evict-2")
    await collection.run_once()
    assert [d["reason"] for d in mover.carry_out(collection.snapshot, metadata)] == ["kubelet"]
    wall[0] += REQUEST_TTL_SECONDS + 1
    (late,) = mover.carry_out(collection.snapshot, metadata)
    assert (late["result"], late["reason"]) == ("refused", "expired")
    assert mover.carry_out(collection.snapshot, metadata) == []  # handled for good


def test_a_pid_given_to_another_process_meanwhile_is_left_alone(fake_root):
    """Seen: a PID checked against the pod once, then moved for minutes. Its start time
    is read again before every call: once the PID names another process, no more."""
    host = host_with_remote_memory()
    root = fake_root(host)
    clock, pages, pod = FakeClock(), FakePages(host), host.pods[0]
    stat = root.root / f"proc/{host.pid(pod, pod.containers[0])}/stat"

    class ReusedAfterOneMove:
        def move_pages(self, pid, addresses, node):
            status = pages.move_pages(pid, addresses, node)
            if node is not None:  # the process ends; another gets its PID
                stat.write_text(stat.read_text().replace(" 4242 ", " 9999 "))
            return status

    moved = move_pod_memory(
        [str(root.pod_cgroup(pod))],
        pod.uid,
        0,
        Pace(64 * MIB, clock, clock.sleep),
        ReusedAfterOneMove(),
        proc=str(root.root / "proc"),
    )
    assert (moved.bytes, dict(moved.failures)) == (BATCH_BYTES, {"pid_reused": 1})


# -- the helper: the one process that holds the capability, and what it takes on trust --


def order_for(root, host: FakeHost, **change) -> wire.MoveOrder:
    """The order the exporter sends for the remote pod: its container's cgroup, node 0."""
    pod = host.pods[0]
    folder = root.pod_cgroup(pod) / root._container_dir(pod, pod.containers[0])
    order = wire.MoveOrder(pod.uid, (str(folder),), 0, frozenset({0}), REMOTE_MIB * MIB)
    return dataclasses.replace(order, **change)


def _another_pod_s_uid(root, host):
    return {"pod_uid": host.pods[1].uid}


def _another_pod_s_folder(root, host):
    web = host.pods[1]
    return {"cgroups": (str(root.pod_cgroup(web) / root._container_dir(web, web.containers[0])),)}


def _out_of_the_cgroup_mount(root, host):
    # a folder named as a pod's container is, elsewhere: the host's /proc would walk
    folder = root.root / "proc" / root.pod_cgroup(host.pods[0]).relative_to(root.root)
    folder = folder / root._container_dir(host.pods[0], host.pods[0].containers[0])
    folder.mkdir(parents=True)
    return {"cgroups": (str(folder),)}


def _up_and_out(root, host):
    (folder,) = order_for(root, host).cgroups
    return {"cgroups": (f"{folder}/../../../../..",)}


def _the_pod_s_own_folder(root, host):
    # above its containers: the walk would take whatever the pod's folder holds
    return {"cgroups": (str(root.pod_cgroup(host.pods[0])),)}


def _a_node_it_may_not_use(root, host):
    host.pods[0].containers[0].mems = "0"
    root.write()
    return {"node": 1, "home": frozenset({1})}


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        (_another_pod_s_uid, "not_the_pod_s_cgroup"),
        (_another_pod_s_folder, "not_the_pod_s_cgroup"),
        (_out_of_the_cgroup_mount, "not_the_pod_s_cgroup"),
        (_up_and_out, "not_the_pod_s_cgroup"),
        (_the_pod_s_own_folder, "not_the_pod_s_cgroup"),
        (_a_node_it_may_not_use, "mems"),
    ],
)
def test_a_forged_order_moves_nothing(fake_root, helper_at, forge, reason):
    """What a subverted exporter could send: the helper checks every order against the
    node's own files, and moves nothing for one that is not a pod's own move home."""
    host = host_with_remote_memory()
    root = fake_root(host)
    pages, clock = FakePages(host), FakeClock()
    client = helper_at(Helper(str(root.root), 64 * MIB, pages, clock, clock.sleep))
    with pytest.raises(wire.Refused) as refused:
        client.move(order_for(root, host, **forge(root, host)))
    assert refused.value.reason == reason
    assert pages.calls == 0
    # the true order, over the same socket: carried out
    moved = client.move(order_for(root, host))
    assert moved.bytes == REMOTE_MIB * MIB


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        b"[]\n",
        b'{"pod_uid": "u"}\n',
        # every field, one of the wrong type (JSON's true is no node)
        b'{"pod_uid": "u", "cgroups": ["/x"], "node": true, "home": [], "far_bytes": 0, '
        b'"namespace": "", "pod": "", "request": ""}\n',
        b"x" * (wire.LINE_BYTES + 10) + b"\n",
        b'{"pod_uid": "u", "cgroups": ["/"]',  # no end of line: the exporter went
    ],
)
def test_a_line_that_is_not_an_order_is_refused(fake_root, helper_at, line):
    host = host_with_remote_memory()
    root = fake_root(host)
    pages = FakePages(host)
    client = helper_at(Helper(str(root.root), 64 * MIB, pages))
    with socket.socket(socket.AF_UNIX) as connection:
        connection.connect(client.path)
        connection.sendall(line)
        connection.shutdown(socket.SHUT_WR)
        answer = connection.makefile("rb").readline()
    with pytest.raises(wire.Refused, match="bad_order"):
        wire.decode_answer(answer)
    assert pages.calls == 0


async def test_a_helper_not_there_yet_is_asked_again_until_it_is(
    node_with_kubelet, helper_at, tmp_path
):
    """The helper's container starts after the exporter's, or restarts: the request is
    refused `no_helper` (said once), and carried out once the helper listens."""
    host, root, collection, metadata = node_with_kubelet
    asking(metadata, host, "evict-1")
    await collection.run_once()
    clock = FakeClock()
    started = helper_at(Helper(str(root.root), 64 * MIB, FakePages(host), clock, clock.sleep))
    mover = MemoryMover(wire.HelperClient(str(tmp_path / "not-yet.sock")))
    (first,) = mover.carry_out(collection.snapshot, metadata)
    assert (first["result"], first["reason"]) == ("refused", "no_helper")
    assert mover.carry_out(collection.snapshot, metadata) == []  # said once
    mover.helper = started
    (done,) = mover.carry_out(collection.snapshot, metadata)
    assert (done["result"], done["bytes"]) == ("moved", REMOTE_MIB * MIB)


def test_the_helper_imports_no_server_nor_client_library():
    """What the capability's process runs is what it needs: no HTTP, NVML, gRPC or
    Kubernetes client, none of the exporter's sources or collectors."""
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, numaguard.exporter.mover.helper; print(*sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()
    foreign = ("aiohttp", "prometheus_client", "pynvml", "grpc", "kubernetes", "pandas")
    assert [m for m in loaded if m.split(".")[0] in foreign] == []
    ours = {m for m in loaded if m.startswith("numaguard.")}
    assert {
        m
        for m in ours
        if not m.startswith(("numaguard.exporter.mover", "numaguard.exporter.readers"))
    } == {
        "numaguard.exporter",
        "numaguard.common",
        "numaguard.common.logs",
        "numaguard.common.help_text",
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="runs as root with one capability")
def test_the_helper_starts_with_cap_sys_ptrace_alone_and_ends_on_sigterm(tmp_path):
    """As its container runs it: every capability dropped but CAP_SYS_PTRACE, it
    listens, answers, and on SIGTERM ends at once, its socket removed; without the
    capability it says what it needs and does not start."""
    path = tmp_path / "mover.sock"
    run = ("setpriv", "--inh-caps=-all", "--ambient-caps=-all")
    command = (sys.executable, "-m", "numaguard.exporter.mover", "--socket", str(path))
    refused = subprocess.run(
        [*run, "--bounding-set=-all", *command], capture_output=True, text=True, cwd=ROOT
    )
    assert refused.returncode == 2 and "needs CAP_SYS_PTRACE" in refused.stderr
    helper = subprocess.Popen(
        [*run, "--bounding-set=-all,+sys_ptrace", *command, "--host-root", str(tmp_path)],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        asyncio.run(until(lambda: asyncio.sleep(0, path.exists()), "the helper listening", 60))
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with pytest.raises(wire.Refused, match="not_the_pod_s_cgroup"):
            wire.HelperClient(str(path)).move(wire.MoveOrder("u", ("/",), 0))
        helper.terminate()
        assert helper.wait(60) == 0
    finally:
        helper.kill()
    assert not path.exists()
    assert '"message": "memory move refused"' in helper.stderr.read()


def test_orders_sent_again_and_again_do_not_outrun_the_rate(fake_root):
    """A subverted exporter stops each move as soon as the helper waits for the rate, and
    asks again: the helper owes the wait across orders, so the second order and every
    one after waits first, and stopped while waiting, moves nothing."""
    host = host_with_remote_memory()
    root = fake_root(host)
    clock, waits = FakeClock(), []

    def cut_short(seconds: float) -> None:  # the exporter half-closes: no time passes
        waits.append(seconds)
        stops[-1].set()

    helper = Helper(str(root.root), 64 * MIB, FakePages(host), clock, cut_short)
    stops: list[threading.Event] = []
    moved = []
    for _ in range(10):
        stops.append(threading.Event())
        moved.append(helper.carry_out(order_for(root, host), stops[-1]).bytes)
    assert moved == [BATCH_BYTES] + [0] * 9
    assert waits == [pytest.approx(BATCH_BYTES / (64 * MIB))] * 10


async def test_a_connection_that_sends_no_order_holds_the_helper_seconds_not_forever(
    fake_root, helper_at
):
    """One order at a time: a connection that never ends its line is dropped after the
    helper's order_seconds, and the next order is carried out."""
    host = host_with_remote_memory()
    root = fake_root(host)
    clock = FakeClock()
    helper = Helper(str(root.root), 64 * MIB, FakePages(host), clock, clock.sleep, 0.2)
    client = helper_at(helper)
    with socket.socket(socket.AF_UNIX) as silent:
        silent.connect(client.path)
        silent.sendall(b'{"pod_uid": ')
        # in a thread: without the bound, it would wait for ever
        moving = asyncio.to_thread(client.move, order_for(root, host))
        assert (await asyncio.wait_for(moving, 60)).bytes == REMOTE_MIB * MIB
        assert b"bad_order" in silent.makefile("rb").readline()


async def test_a_defect_in_the_helper_is_an_answer_and_the_next_order_is_served(
    fake_root, helper_at
):
    host = host_with_remote_memory()
    root = fake_root(host)
    clock = FakeClock()

    class Failing(FakePages):
        def move_pages(self, pid, addresses, node):
            raise RuntimeError("a defect")

    failing = Helper(str(root.root), 64 * MIB, Failing(host), clock, clock.sleep)
    client = helper_at(failing)
    serving = threading.active_count()
    with contextlib.ExitStack() as kept:  # connections their exporter keeps open
        for _ in range(3):
            connection = kept.enter_context(socket.socket(socket.AF_UNIX))
            connection.connect(client.path)
            connection.sendall(wire.encode_order(order_for(root, host)))
            with pytest.raises(wire.Refused, match="helper_error"):
                wire.decode_answer(connection.makefile("rb").readline())
        # each order's watcher of its connection ends with the order, not the connection
        watchers = lambda: asyncio.sleep(0, threading.active_count() == serving)  # noqa: E731
        await until(watchers, "the watchers gone")


def test_a_pid_reused_between_its_start_time_and_its_cgroup_is_left_alone(fake_root, monkeypatch):
    """The cgroup read between two reads of the start time: a PID that named the pod's
    process at the first and another at the second is not moved."""
    host = host_with_remote_memory()
    root = fake_root(host)
    pod = host.pods[0]
    stat = root.root / f"proc/{host.pid(pod, pod.containers[0])}/stat"
    clock, pages = FakeClock(), FakePages(host)

    def opening(path, *args, **kwargs):
        if str(path).endswith("/cgroup"):  # the process ends now; another gets its PID
            stat.write_text(stat.read_text().replace(" 4242 ", " 9999 "))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(mover_pages, "open", opening, raising=False)
    moved = move_pod_memory(
        [str(root.pod_cgroup(pod))],
        pod.uid,
        0,
        Pace(64 * MIB, clock, clock.sleep),
        pages,
        proc=str(root.root / "proc"),
    )
    assert (moved.bytes, dict(moved.failures), pages.calls) == (0, {"pid_reused": 1}, 0)

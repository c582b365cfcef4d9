"""Bad input at the collector level: broken, missing, unreadable and huge files, counter
resets and vanishing pods. No exception escapes, the exposition is still rendered, the
error counter rises with the right reason, and no verdict is made on doubtful data."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numaguard.exporter.sources as sources
from numaguard.exporter.sources import KEPT, ReadFailure, read_text
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import FakeHostRoot
from numaguard.simulator.fakes.resctrl import FakeResctrl
from numaguard.simulator.parts.processes import until
from tests.conftest import examples, make_collection, metadata_of, samples, series


def errors(got, collector: str, reason: str) -> float:
    return got[series("numaguard_collector_errors_total", collector=collector, reason=reason)]


def container_dir(root: FakeHostRoot, pod_name: str) -> Path:
    pod = root.host.pod(pod_name)
    cid = root.host.container_id(pod, pod.containers[0])
    return next(root.root.glob(f"sys/fs/cgroup/kubepods*/**/*{cid}*"))


async def test_garbage_numa_stat_drops_only_that_pods_memory_verdict(fake_root):
    root = fake_root(presets.far_memory())
    (container_dir(root, "cache") / "memory.numa_stat").write_text("anon N0=12 N1=zz\n")
    collection = make_collection(root, metadata=metadata_of(root.host))
    await collection.run_once()
    got = samples(collection.exposition.text)
    assert errors(got, "pod_placement", "parse") == 1
    assert got[series("numaguard_collector_success", collector="pod_placement")] == 0
    cache = root.host.pod("cache")
    labels = dict(namespace="cache", pod="cache", pod_uid=cache.uid)
    # memory unknown: no ratio and no memory_remote verdict, but the CPU verdict stands
    assert series("numaguard_pod_memory_remote_ratio", **labels) not in got
    assert series("numaguard_pod_cross_numa", **labels, reason="memory_remote") not in got
    assert got[series("numaguard_pod_cross_numa", **labels, reason="cpu_span")] == 0
    # the other pod is untouched
    web = root.host.pod("web")
    assert (
        got[
            series(
                "numaguard_pod_memory_remote_ratio", namespace="default", pod="web", pod_uid=web.uid
            )
        ]
        == 0
    )


async def test_a_fifo_or_device_costs_only_its_pod_and_heals(fake_root):
    """A FIFO (whose open would wait for a writer forever) in place of one pod's
    memory.numa_stat, and an endless device (/dev/zero) in place of another's cpu.stat:
    neither is opened for reading; only those pods' values go, every other pod keeps
    its series; once the files are regular again, so are the series."""
    root = fake_root(presets.far_memory())
    host = root.host
    numa_stat = container_dir(root, "cache") / "memory.numa_stat"
    cpu_stat = container_dir(root, "web") / "cpu.stat"
    saved = {path: path.read_bytes() for path in (numa_stat, cpu_stat)}
    collection = make_collection(root, metadata=metadata_of(host), timeout=30)
    await collection.run_once()
    before = samples(collection.exposition.text)
    numa_stat.unlink()
    os.mkfifo(numa_stat)
    cpu_stat.unlink()
    cpu_stat.symlink_to("/dev/zero")
    await collection.run_once()
    got = samples(collection.exposition.text)
    assert errors(got, "pod_placement", "not_regular") == 2
    assert got[series("numaguard_collector_success", collector="pod_placement")] == 0
    pod_series = lambda g: {  # noqa: E731
        (name, dict(labels)["pod"])
        for name, labels in g
        if name.startswith(("numaguard_pod_", "numaguard_container_")) and dict(labels).get("pod")
    }
    # only what those two files tell: the one pod's memory, the other's CPU time
    assert pod_series(before) - pod_series(got) == {
        ("numaguard_pod_memory_bytes", "cache"),
        ("numaguard_pod_memory_remote_ratio", "cache"),
        ("numaguard_container_memory_bytes", "cache"),
        ("numaguard_container_memory_remote_ratio", "cache"),
        ("numaguard_container_cpu_periods_total", "web"),
        ("numaguard_container_cpu_throttled_periods_total", "web"),
        ("numaguard_container_cpu_throttled_seconds_total", "web"),
        ("numaguard_pod_cpu_throttled_seconds_total", "web"),
    }
    for path, content in saved.items():
        path.unlink()
        path.write_bytes(content)
    await collection.run_once()
    healed = samples(collection.exposition.text)
    assert pod_series(healed) == pod_series(before)
    assert errors(healed, "pod_placement", "not_regular") == 2  # counted once each, then fine
    assert healed[series("numaguard_collector_success", collector="pod_placement")] == 1


async def test_a_directory_that_cannot_be_listed_is_unknown_not_empty(fake_root):
    """Pods under a QoS slice that cannot be listed (here: not a directory any more)
    are unknown: the collector says so, rather than report them gone with success=1;
    so is a resctrl mon_data that vanished."""
    root = fake_root(presets.two_socket())
    kernel = FakeResctrl(root.root, root.host).write()
    collection = make_collection(root, metadata=metadata_of(root.host), resctrl=kernel)
    await collection.run_once()
    burstable = container_dir(root, "web").parent.parent  # web is a burstable pod
    assert burstable.name == "kubepods-burstable.slice"
    shutil.rmtree(burstable)
    burstable.write_text("")
    shutil.rmtree(kernel.base / "mon_data")
    await collection.run_once()
    got = samples(collection.exposition.text)
    assert errors(got, "pod_placement", "io") == 1
    assert got[series("numaguard_collector_success", collector="pod_placement")] == 0
    assert errors(got, "resctrl", "missing") == 1
    assert got[series("numaguard_collector_success", collector="resctrl")] == 0


async def test_unreadable_cpulist_means_no_cpu_verdicts(fake_root):
    root = fake_root(presets.two_socket())
    (root.root / "sys/devices/system/node/node1/cpulist").write_text("16-x\n")
    collection = make_collection(root, metadata=metadata_of(root.host))
    await collection.run_once()
    got = samples(collection.exposition.text)
    assert errors(got, "host_numa", "parse") == 1
    # CPUs 16-31 cannot be placed on a node: pods using any of them get no CPU verdict,
    # a pod whose CPUs are all on node 0 still does
    verdicts = {
        dict(k[1])["pod"]: v
        for k, v in got.items()
        if k[0] == "numaguard_pod_cross_numa" and ("reason", "cpu_span") in k[1]
    }
    assert verdicts == {"trainer-aligned": 0}
    assert got[series("numaguard_numa_node_memory_total_bytes", numa_node="0")] > 0


async def test_missing_and_oversized_files(fake_root):
    root = fake_root(presets.two_socket())
    (root.root / "sys/devices/system/node/node0/numastat").unlink()
    (root.root / "sys/devices/system/node/node1/meminfo").write_text(
        "Node 1 MemTotal: 1 kB\n" * 60000
    )
    collection = make_collection(root)
    await collection.run_once()
    got = samples(collection.exposition.text)
    assert errors(got, "host_numa", "missing") == 1
    assert errors(got, "host_numa", "oversized") == 1
    assert series("numaguard_numa_node_memory_total_bytes", numa_node="1") not in got
    assert got[series("numaguard_numa_node_memory_total_bytes", numa_node="0")] > 0


def test_permission_denied_is_reported_as_such(tmp_path):
    path = tmp_path / "secret"
    path.write_text("1\n")
    path.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(ReadFailure) as err:
            read_text(str(path))
        assert err.value.issue.reason == "permission"
        return
    # root reads anything: check as an unprivileged user in a child process
    tmp_path.chmod(0o755)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            read_text(str(path))
            code = 1
        except ReadFailure as failure:
            code = 0 if failure.issue.reason == "permission" else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


async def test_counter_reset_gives_no_ratio(fake_root):
    host = presets.two_socket()
    host.nodes[0].numastat.update(local_node=1000, other_node=500)
    root = fake_root(host)
    collection = make_collection(root)
    await collection.run_once()
    host.nodes[0].numastat.update(local_node=10, other_node=5)  # reboot-like reset
    root.write()
    await collection.run_once()
    got = samples(collection.exposition.text)
    assert series("numaguard_numa_node_remote_alloc_ratio", numa_node="0") not in got
    assert got[series("numaguard_collector_success", collector="host_numa")] == 1
    host.nodes[0].numastat.update(local_node=40, other_node=15)
    root.write()
    await collection.run_once()
    got = samples(collection.exposition.text)
    assert got[series("numaguard_numa_node_remote_alloc_ratio", numa_node="0")] == pytest.approx(
        0.25
    )


async def test_pod_that_vanishes_is_dropped_without_error(fake_root):
    host = presets.two_socket()
    root = fake_root(host)
    collection = make_collection(root, metadata=metadata_of(host))
    await collection.run_once()
    host.pods = [p for p in host.pods if p.name != "web"]
    root.write()
    await collection.run_once()
    got = samples(collection.exposition.text)
    assert not [k for k in got if ("pod", "web") in k[1]]
    assert got[series("numaguard_collector_success", collector="pod_placement")] == 1


def test_container_gone_mid_read_is_not_an_error(fake_root):
    """The cgroup disappears between discovery and reading its files."""
    from numaguard.exporter.sources.cgroups import CgroupSource

    root = fake_root(presets.two_socket())
    source = CgroupSource(str(root.root))
    layout = source._layout()
    victim = container_dir(root, "web")
    rel = str(victim.relative_to(layout.roots[""]))
    shutil.rmtree(victim)
    issues = []
    assert source._read_container(layout, rel, issues) is None
    assert issues == []


FILES = [
    "sys/devices/system/node/online",
    "sys/devices/system/node/node0/cpulist",
    "sys/devices/system/node/node1/distance",
    "sys/devices/system/node/node0/meminfo",
    "sys/devices/system/node/node1/numastat",
    "sys/devices/system/cpu/online",
    "sys/devices/system/cpu/cpu3/topology/physical_package_id",
    "sys/devices/system/cpu/cpu3/topology/core_cpus_list",
    "sys/devices/system/cpu/smt/active",
    "proc/vmstat",
    "proc/stat",
]


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    which=st.integers(0, len(FILES) + 3),
    content=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)),
)
async def test_any_content_in_any_file_never_breaks_the_cycle(tmp_path_factory, which, content):
    host = presets.two_socket()
    root = FakeHostRoot(tmp_path_factory.mktemp("host"), host).write()
    if which < len(FILES):
        target = root.root / FILES[which]
    else:
        names = ["memory.numa_stat", "cpuset.cpus.effective", "cpu.stat", "cpu.pressure"]
        target = container_dir(root, "trainer-split") / names[which - len(FILES)]
    target.write_bytes(content)
    collection = make_collection(root, metadata=metadata_of(host))
    await collection.run_once()
    await collection.run_once()
    got = samples(collection.exposition.text)
    failed = sum(v for k, v in got.items() if k[0] == "numaguard_collector_errors_total")
    health = [
        got[series("numaguard_collector_success", collector=c)]
        for c in ("host_numa", "pod_placement")
    ]
    # either the content happened to be valid, or it was counted and flagged
    assert (failed == 0 and health == [1, 1]) or (failed > 0 and 0 in health)


RESCTRL_FILES = [
    "sys/fs/resctrl/info/L3_MON/num_rmids",
    "sys/fs/resctrl/info/L3_MON/mon_features",
    "sys/fs/resctrl/mon_data/mon_L3_00/mbm_total_bytes",
    "sys/fs/resctrl/mon_data/mon_L3_01/llc_occupancy",
    "sys/devices/system/cpu/cpu0/cache/index3/size",
    "sys/devices/system/cpu/cpu16/cache/index3/shared_cpu_list",
]


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    which=st.integers(0, len(RESCTRL_FILES) + 1),
    content=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)),
)
async def test_any_content_in_resctrl_files_never_breaks_the_cycle(
    tmp_path_factory, which, content
):
    host = presets.two_socket()
    root = FakeHostRoot(tmp_path_factory.mktemp("host"), host).write()
    kernel = FakeResctrl(root.root, host).write()
    collection = make_collection(root, metadata=metadata_of(host), resctrl=kernel)
    await collection.run_once()  # groups exist now
    if which < len(RESCTRL_FILES):
        target = root.root / RESCTRL_FILES[which]
    elif which == len(RESCTRL_FILES):
        group = kernel.base / "mon_groups" / kernel.group_names()[0]
        target = group / "mon_data/mon_L3_00/mbm_local_bytes"
    else:
        target = container_dir(root, "web") / "cgroup.threads"
    target.write_bytes(content)
    await collection.run_once()
    got = samples(collection.exposition.text)
    assert got[series("numaguard_resctrl_available")] in (0, 1)
    errors_now = sum(v for k, v in got.items() if k[0] == "numaguard_collector_errors_total")
    health = [
        got[series("numaguard_collector_success", collector=c)]
        for c in ("host_numa", "pod_placement", "resctrl")
    ]
    assert (errors_now == 0 and health == [1, 1, 1]) or (errors_now > 0 and 0 in health)


def _open_fds() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own, closed since
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
    return found


def test_a_kept_file_is_read_as_it_is_now_and_forgotten_when_gone(tmp_path):
    """Files stay open between cycles and are read again at offset 0: what is read is
    the content now — changed in place, replaced by a rename (as the fake host writes),
    removed (missing, never the old content), or a process that exited (ESRCH, on this
    machine's /proc) — and a file no cycle read is closed."""
    path = tmp_path / "cpu.stat"
    path.write_text("usage_usec 1\n")
    assert read_text(str(path)) == "usage_usec 1\n"
    assert str(path) in _open_fds()  # kept for the next read
    with path.open("r+") as f:  # in place, as the kernel's own files change
        f.write("usage_usec 2\n")
    assert read_text(str(path)) == "usage_usec 2\n"
    fresh = tmp_path / ".cpu.stat.tmp"
    fresh.write_text("usage_usec 3 replaced\n")
    fresh.replace(path)
    assert read_text(str(path)) == "usage_usec 3 replaced\n"
    path.unlink()
    with pytest.raises(ReadFailure) as err:
        read_text(str(path))
    assert err.value.issue.reason == "missing"

    child = subprocess.Popen(["sleep", "60"])
    cgroup = f"/proc/{child.pid}/cgroup"
    assert read_text(cgroup)
    child.kill()
    child.wait()
    with pytest.raises(ReadFailure) as err:
        read_text(cgroup)
    assert err.value.issue.reason == "missing"

    other = tmp_path / "memory.stat"
    other.write_text("anon 1\n")
    read_text(str(other))
    KEPT.sweep()  # a cycle begins: other was read in the last one, stays
    assert str(other) in _open_fds()
    KEPT.sweep()  # a cycle that did not read it: closed
    assert str(other) not in _open_fds()


def test_the_files_kept_open_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(KEPT, "limit", len(KEPT.fds) + 3)
    paths = [tmp_path / f"f{i}" for i in range(10)]
    for p in paths:
        p.write_text("1\n")
        assert read_text(str(p)) == "1\n"
    open_now = _open_fds()
    assert sum(str(p) in open_now for p in paths) == 3
    for p in paths:  # those not kept are read as well, opened each time
        assert read_text(str(p)) == "1\n"


async def test_a_read_stuck_in_the_kernel_costs_only_its_pod(fake_root, monkeypatch):
    """A read that never returns (a task in D state on one pod's cgroup file) costs that
    pod only: the cycle ends with every other pod, says timeout, does not read the pod
    again while that read is stuck (one thread left behind, not one a cycle), and has
    it back once the read returns."""
    root = fake_root(presets.far_memory())
    stuck = str(container_dir(root, "cache") / "memory.numa_stat")
    released = threading.Event()
    calls: list[str] = []
    original = sources.read_text

    def in_d_state(path: str) -> str:
        if path == stuck:
            calls.append(path)
            released.wait(60)
        return original(path)

    collection = make_collection(root, metadata=metadata_of(root.host))
    await collection.run_once()
    before = samples(collection.exposition.text)
    pods_of = lambda got: {  # noqa: E731
        dict(labels)["pod"] for name, labels in got if name == "numaguard_container_info"
    }
    monkeypatch.setattr(sources, "read_text", in_d_state)
    try:
        for _ in range(3):
            await collection.run_once()
            got = samples(collection.exposition.text)
            assert pods_of(got) == pods_of(before) - {"cache"}
            assert errors(got, "pod_placement", "timeout") >= 1
        assert len(calls) == 1  # not asked again while the first read is stuck
    finally:
        released.set()

    async def all_back():  # the stuck thread ends its read, then the pod is read again
        await collection.run_once()
        return pods_of(samples(collection.exposition.text)) == pods_of(before)

    await until(all_back, "the pod back")

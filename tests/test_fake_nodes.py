"""Every catalogue value, asserted exactly, over fake roots of three kinds of node.

Expected numbers are written out by hand from the preset descriptions; ratios are
compared to 1e-9, everything else exactly. The sets of series must match exactly too:
a missing or an extra series fails.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import numaguard.exporter.sources as sources
from numaguard.contract.catalogue import CATALOGUE, NUMASTAT
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import GIB, MIB, SANDBOX, FakeContainer, FakeHostRoot
from tests.conftest import make_collection, metadata_of, samples, series

# the exporter's own health and process series, whose values are its own, not the node's
HEALTH = {name for name, spec in CATALOGUE.items() if spec.group in ("health", "process")}


def without_health(got: dict) -> dict:
    return {
        k: v
        for k, v in got.items()
        if not any(k[0].startswith(h.removesuffix("_total")) for h in HEALTH)
    }


def assert_samples(got: dict, want: dict) -> None:
    got = without_health(got)
    missing = sorted(set(want) - set(got), key=str)
    extra = sorted(set(got) - set(want), key=str)
    assert not missing and not extra, f"missing={missing[:5]} extra={extra[:5]}"
    for key, value in want.items():
        if key[0].endswith("_ratio"):
            assert got[key] == pytest.approx(value, abs=1e-9), key
        else:
            assert got[key] == value, key


def host_numa(nodes, distance, numastat, remote, balancing=None, locality=None) -> dict:
    """nodes: [(cpulist, {socket: cpus}, total, free)]; numastat: per node dict."""
    out = {}
    for i, (cpulist, sockets, total, free) in enumerate(nodes):
        n = str(i)
        out[series("numaguard_numa_node_info", numa_node=n, cpulist=cpulist)] = 1
        for socket, count in sockets.items():
            out[series("numaguard_numa_node_cpus", numa_node=n, socket=str(socket))] = count
        out[series("numaguard_numa_node_memory_total_bytes", numa_node=n)] = total
        out[series("numaguard_numa_node_memory_free_bytes", numa_node=n)] = free
        out[series("numaguard_numa_node_memory_used_bytes", numa_node=n)] = total - free
        for kind, value in numastat[i].items():
            out[series(NUMASTAT[kind].name, numa_node=n)] = value
        for j, d in enumerate(distance[i]):
            out[series("numaguard_numa_node_distance", numa_node=n, target_numa_node=str(j))] = d
        if remote[i] is not None:
            out[series("numaguard_numa_node_remote_alloc_ratio", numa_node=n)] = remote[i]
    for key, value in (balancing or {}).items():
        out[series(f"numaguard_numa_balancing_{key}_total")] = value
    if locality is not None:
        out[series("numaguard_numa_balancing_hint_fault_locality_ratio")] = locality
    out[series("numaguard_node_smt_active")] = 0  # the fake hosts' cores have one thread
    out[series("numaguard_node_cpus_per_core")] = 1
    # these exporters run no resctrl collector: it says so, and nothing else of it shows
    out[series("numaguard_resctrl_available")] = 0
    out[series("numaguard_resctrl_mode_info", mode="off")] = 1
    return out


def container(
    ids, qos, runtime, exclusive, cpus, memory, remote, spanned, throttling=(0, 0, 0.0), psi=None
) -> dict:
    """ids: (namespace, pod, container, pod_uid, container_id)."""
    ns, pod, name, uid, cid = ids
    labels = dict(namespace=ns, pod=pod, container=name, pod_uid=uid, container_id=cid)
    out = {
        series(
            "numaguard_container_info",
            **labels,
            qos_class=qos,
            runtime=runtime,
            exclusive_cpus="true" if exclusive else "false",
        ): 1,
        series("numaguard_container_memory_remote_ratio", **labels): remote,
        series("numaguard_container_numa_nodes_spanned", **labels): spanned,
        series("numaguard_container_cpu_periods_total", **labels): throttling[0],
        series("numaguard_container_cpu_throttled_periods_total", **labels): throttling[1],
        series("numaguard_container_cpu_throttled_seconds_total", **labels): throttling[2],
    }
    # per-node series exist only for nodes holding some of the container's CPUs or memory
    for n, count in enumerate(cpus):
        if count:
            out[series("numaguard_container_cpus", **labels, numa_node=str(n))] = count
    for n, size in enumerate(memory):
        if size:
            out[series("numaguard_container_memory_bytes", **labels, numa_node=str(n))] = size
    for resource, (some, full) in (psi or {}).items():
        name_ = f"numaguard_container_{resource}_pressure_seconds_total"
        out[series(name_, **labels, stall="some")] = some
        out[series(name_, **labels, stall="full")] = full
    return out


def pod(
    ids, cpus, memory, remote, spanned, cpu_span, memory_remote, throttled, psi=None, l3=None
) -> dict:
    """cpu_span None: a pod without exclusive CPUs (no such verdict); else its CPUs are
    its exclusive ones, spanning l3 = (L3 caches, the fewest that could hold them).
    throttled and psi (cpu, memory: PSI some): its containers' summed."""
    ns, name, uid = ids
    labels = dict(namespace=ns, pod=name, pod_uid=uid)
    out = {
        series("numaguard_pod_memory_remote_ratio", **labels): remote,
        series("numaguard_pod_numa_nodes_spanned", **labels): spanned,
        series("numaguard_pod_cross_numa", **labels, reason="memory_remote"): memory_remote,
        series("numaguard_pod_cpu_throttled_seconds_total", **labels): throttled,
    }
    if cpu_span is not None:
        out[series("numaguard_pod_cross_numa", **labels, reason="cpu_span")] = cpu_span
        out[series("numaguard_pod_l3_domains", **labels)] = l3[0]
        out[series("numaguard_pod_l3_domains_fewest", **labels)] = l3[1]
    if psi is not None:
        for resource, some in zip(("cpu", "memory"), psi, strict=True):
            out[series(f"numaguard_pod_{resource}_pressure_seconds_total", **labels)] = some
    for n, count in enumerate(cpus):
        if count:
            out[series("numaguard_pod_cpus", **labels, numa_node=str(n))] = count
            if cpu_span is not None:
                out[series("numaguard_pod_exclusive_cpus", **labels, numa_node=str(n))] = count
    for n, size in enumerate(memory):
        if size:
            out[series("numaguard_pod_memory_bytes", **labels, numa_node=str(n))] = size
    return out


ZERO_PSI = {"cpu": (0, 0), "memory": (0, 0), "io": (0, 0)}
NUMASTAT0 = dict.fromkeys(
    ("numa_hit", "numa_miss", "numa_foreign", "interleave_hit", "local_node", "other_node"), 0
)


async def two_cycles(fake_root, host, advance):
    """Run a cycle, let ``advance`` move the host on, write it, run a second cycle."""
    root = fake_root(host)
    collection = make_collection(root, metadata=metadata_of(host))
    await collection.run_once()
    advance(host)
    root.write()
    await collection.run_once()
    return samples(collection.exposition.text)


async def test_two_socket_cgroup_v2_systemd(fake_root):
    host = presets.two_socket()

    def advance(h):
        h.nodes[0].numastat.update(numa_hit=1000, local_node=900, other_node=100)
        h.nodes[1].numastat.update(numa_hit=50, numa_miss=5, numa_foreign=7, interleave_hit=3)
        h.balancing.update(numa_hint_faults=200, numa_hint_faults_local=150, numa_pages_migrated=7)
        h.pod("web").containers[0].throttling = (400, 40, 1.25)

    got = await two_cycles(fake_root, host, advance)
    node1_stat = {
        **NUMASTAT0,
        "numa_hit": 50,
        "numa_miss": 5,
        "numa_foreign": 7,
        "interleave_hit": 3,
    }
    want = host_numa(
        nodes=[("0-15", {0: 16}, 128 * GIB, 100 * GIB), ("16-31", {1: 16}, 128 * GIB, 90 * GIB)],
        distance=[[10, 21], [21, 10]],
        numastat=[
            {**NUMASTAT0, "numa_hit": 1000, "local_node": 900, "other_node": 100},
            node1_stat,
        ],
        remote=[0.1, None],  # node 1 allocated nothing locally or remotely: no ratio
        balancing={"hint_faults": 200, "hint_faults_local": 150, "pages_migrated": 7},
        locality=0.75,
    )
    cid = {(p.name, c.name): host.container_id(p, c) for p in host.pods for c in p.containers}
    aligned, split, web = (host.pod(n) for n in ("trainer-aligned", "trainer-split", "web"))
    want |= container(
        ("ml", "trainer-aligned", "main", aligned.uid, cid["trainer-aligned", "main"]),
        "guaranteed",
        "containerd",
        True,
        cpus=[4, 0],
        memory=[8 * GIB, 256 * MIB],
        remote=256 / (8 * 1024 + 256),
        spanned=1,
        throttling=(1000, 10, 0.5),
        psi={"cpu": (1.5, 0.5), "memory": (0.25, 0.125), "io": (2.0, 1.0)},
    )
    want |= pod(
        ("ml", "trainer-aligned", aligned.uid),
        [4, 0],
        [8 * GIB, 256 * MIB],
        256 / (8 * 1024 + 256),
        1,
        cpu_span=0,
        l3=(1, 1),
        memory_remote=0,
        throttled=0.5,
        psi=(1.5, 0.25),
    )
    want |= container(
        ("ml", "trainer-split", "main", split.uid, cid["trainer-split", "main"]),
        "guaranteed",
        "containerd",
        True,
        cpus=[2, 2],
        memory=[4 * GIB, 4 * GIB],
        remote=0.0,
        spanned=2,
        psi=ZERO_PSI,
    )
    want |= pod(
        ("ml", "trainer-split", split.uid),
        [2, 2],
        [4 * GIB, 4 * GIB],
        0.0,
        2,
        cpu_span=1,
        l3=(2, 1),
        memory_remote=0,
        throttled=0.0,
        psi=(0, 0),
    )
    want |= container(
        ("default", "web", "app", web.uid, cid["web", "app"]),
        "burstable",
        "containerd",
        False,
        cpus=[10, 14],
        memory=[200 * MIB, 100 * MIB],
        remote=0.0,
        spanned=2,
        throttling=(400, 40, 1.25),
        psi=ZERO_PSI,
    )
    want |= container(
        ("default", "web", "sidecar", web.uid, cid["web", "sidecar"]),
        "burstable",
        "containerd",
        False,
        cpus=[10, 14],
        memory=[20 * MIB, 0],
        remote=0.0,
        spanned=2,
        psi=ZERO_PSI,
    )
    want |= pod(
        ("default", "web", web.uid),
        [10, 14],
        [220 * MIB, 100 * MIB],
        0.0,
        2,
        cpu_span=None,
        memory_remote=0,
        throttled=1.25,
        psi=(0, 0),
    )
    assert_samples(got, want)
    assert got[series("numaguard_collector_success", collector="pod_placement")] == 1
    assert got[series("numaguard_collector_success", collector="host_numa")] == 1
    assert got[series("numaguard_pod_metadata_synced")] == 1


async def test_four_node_cgroup_v1_cgroupfs(fake_root):
    host = presets.four_node_v1()

    def advance(h):
        h.nodes[2].numastat.update(local_node=30, other_node=10, numa_hit=40)
        h.nodes[3].numastat.update(local_node=5, other_node=0, numa_hit=5)

    got = await two_cycles(fake_root, host, advance)
    want = host_numa(
        nodes=[
            ("0-7", {0: 8}, 32 * GIB, 20 * GIB),
            ("8-15", {0: 8}, 32 * GIB, 21 * GIB),
            ("16-23", {1: 8}, 32 * GIB, 22 * GIB),
            ("24-31", {1: 8}, 32 * GIB, 23 * GIB),
        ],
        distance=[[10, 12, 20, 20], [12, 10, 20, 20], [20, 20, 10, 12], [20, 20, 12, 10]],
        numastat=[
            NUMASTAT0,
            NUMASTAT0,
            {**NUMASTAT0, "local_node": 30, "other_node": 10, "numa_hit": 40},
            {**NUMASTAT0, "local_node": 5, "numa_hit": 5},
        ],
        remote=[None, None, 0.25, 0.0],
    )  # no NUMA-balancing counters on this kernel: no balancing series at all
    db, batch, logger = (host.pod(n) for n in ("db", "batch", "logger"))
    cid = {(p.name, c.name): host.container_id(p, c) for p in host.pods for c in p.containers}
    want |= container(
        ("data", "db", "postgres", db.uid, cid["db", "postgres"]),
        "guaranteed",
        "",
        True,
        cpus=[0, 4, 0, 0],
        memory=[0, 2 * GIB, 1 * GIB, 0],
        remote=1 / 3,
        spanned=1,
        throttling=(500, 50, 2.25),
    )
    want |= pod(
        ("data", "db", db.uid),
        [0, 4, 0, 0],
        [0, 2 * GIB, 1 * GIB, 0],
        1 / 3,
        1,
        cpu_span=0,
        l3=(1, 1),
        memory_remote=1,
        throttled=2.25,
    )
    want |= container(
        ("data", "batch", "worker", batch.uid, cid["batch", "worker"]),
        "guaranteed",
        "",
        True,
        cpus=[2, 2, 0, 0],
        memory=[512 * MIB, 512 * MIB, 0, 0],
        remote=0.0,
        spanned=2,
    )
    want |= pod(
        ("data", "batch", batch.uid),
        [2, 2, 0, 0],
        [512 * MIB, 512 * MIB, 0, 0],
        0.0,
        2,
        cpu_span=1,
        l3=(1, 1),
        memory_remote=0,
        throttled=0.0,
    )
    want |= container(
        ("kube-system", "logger", "fluent", logger.uid, cid["logger", "fluent"]),
        "besteffort",
        "",
        False,
        cpus=[6, 2, 8, 8],
        memory=[0, 0, 0, 64 * MIB],
        remote=0.0,
        spanned=4,
    )
    want |= pod(
        ("kube-system", "logger", logger.uid),
        [6, 2, 8, 8],
        [0, 0, 0, 64 * MIB],
        0.0,
        4,
        cpu_span=None,
        memory_remote=0,
        throttled=0.0,
    )
    assert_samples(got, want)


async def test_pod_memory_mostly_on_far_node(fake_root):
    host = presets.far_memory()
    got = await two_cycles(fake_root, host, lambda h: None)
    want = host_numa(
        nodes=[("0-15", {0: 16}, 128 * GIB, 100 * GIB), ("16-31", {1: 16}, 128 * GIB, 90 * GIB)],
        distance=[[10, 21], [21, 10]],
        numastat=[NUMASTAT0, NUMASTAT0],
        remote=[None, None],
        balancing={"hint_faults": 0, "hint_faults_local": 0, "pages_migrated": 0},
    )
    cache, web = host.pod("cache"), host.pod("web")
    cid = {(p.name, c.name): host.container_id(p, c) for p in host.pods for c in p.containers}
    want |= container(
        ("cache", "cache", "redis", cache.uid, cid["cache", "redis"]),
        "guaranteed",
        "containerd",
        True,
        cpus=[2, 0],
        memory=[1 * GIB, 4 * GIB],
        remote=0.8,
        spanned=1,
        psi=ZERO_PSI,
    )
    want |= pod(
        ("cache", "cache", cache.uid),
        [2, 0],
        [1 * GIB, 4 * GIB],
        0.8,
        1,
        cpu_span=0,
        l3=(1, 1),
        memory_remote=1,
        throttled=0.0,
        psi=(0, 0),
    )
    want |= container(
        ("default", "web", "app", web.uid, cid["web", "app"]),
        "burstable",
        "containerd",
        False,
        cpus=[14, 16],
        memory=[100 * MIB, 100 * MIB],
        remote=0.0,
        spanned=2,
        psi=ZERO_PSI,
    )
    want |= pod(
        ("default", "web", web.uid),
        [14, 16],
        [100 * MIB, 100 * MIB],
        0.0,
        2,
        cpu_span=None,
        memory_remote=0,
        throttled=0.0,
        psi=(0, 0),
    )
    assert_samples(got, want)


async def test_by_default_the_detail_is_left_out_and_nothing_else(fake_root):
    """Without --detail: no detail family at all, and the per-NUMA-node memory, throttling
    and stalls only of pods holding exclusive CPUs (the trainers; web is in the shared
    pool); every other series is the same, with the same value, as with --detail."""
    host = presets.two_socket()
    got = {}
    for detail in (False, True):
        root = fake_root(host)
        collection = make_collection(root, metadata=metadata_of(host), detail=detail)
        await collection.run_once()
        got[detail] = without_health(samples(collection.exposition.text))
    default, full = got[False], got[True]
    detail = {name for name, spec in CATALOGUE.items() if spec.detail}
    assert not {name for name, _ in default} & detail
    # (this node runs no resctrl or GPU collector: its detail is all pod placement)
    assert {name for name, _ in full} & detail == {
        name for name in detail if CATALOGUE[name].group == "pod_placement"
    }
    web = host.pod("web").uid
    per_pod = {
        "numaguard_pod_memory_bytes",
        "numaguard_pod_cpu_throttled_seconds_total",
        "numaguard_pod_cpu_pressure_seconds_total",
        "numaguard_pod_memory_pressure_seconds_total",
    }
    # the breakdowns behind a core-isolation verdict, by default only where it is 1 (no
    # pod's here: one L3 a socket has no l3_span, a core of one thread no smt_shared)
    behind = {"numaguard_pod_l3_domains", "numaguard_pod_l3_domains_fewest"}
    left_out = {
        k for k in full if k[0] in detail | behind or (k[0] in per_pod and ("pod_uid", web) in k[1])
    }
    assert {k[0] for k in left_out} - detail == per_pod | behind
    assert default == {k: v for k, v in full.items() if k not in left_out}
    # the trainers keep theirs
    for name in ("trainer-aligned", "trainer-split"):
        uid = host.pod(name).uid
        assert {n for n, labels in default if ("pod_uid", uid) in labels} >= per_pod


async def test_sandbox_cgroups_cost_no_read_once_the_pods_are_named(tmp_path):
    """A real node has a pause container's cgroup beside each pod's containers; nobody
    names it, and once the API server has named a pod's containers, its files are not
    even read. The exposition is what it is on the same node without sandboxes."""
    exposition = {}
    read = {}
    for sandboxes in (False, True):
        host = presets.two_socket()
        host.sandboxes = sandboxes
        root = FakeHostRoot(tmp_path / str(sandboxes), host).write()
        paths = []
        original = sources.read_text

        def recording(path, original=original, paths=paths):
            paths.append(path)
            return original(path)

        collection = make_collection(root, metadata=metadata_of(host))
        sources.read_text = recording
        try:
            await collection.run_once()
        finally:
            sources.read_text = original
        read[sandboxes] = paths
        exposition[sandboxes] = samples(collection.exposition.text)
    pauses = [host.container_id(p, FakeContainer(SANDBOX, "0")) for p in host.pods]
    written = [d for d in (tmp_path / "True").rglob("*.scope") if any(c in d.name for c in pauses)]
    assert len(written) == len(host.pods)  # the fake node has them ...
    assert not [p for p in read[True] if any(c in p for c in pauses)]  # ... and none is read
    assert len(read[True]) == len(read[False])
    assert exposition[True].keys() == exposition[False].keys()


async def test_a_pod_known_before_its_containers_ids_has_no_series_yet(tmp_path):
    """The API server knows a pod a few seconds before the kubelet posts its containers'
    ids. Until then its cgroups are not read: its sandbox, whose cpuset is every CPU,
    would be taken for a container and its CPUs counted as the pod's (seen on the real
    kubelet's node). Once the ids are there, the pod is what it is."""
    host = presets.two_socket()
    host.sandboxes = True
    root = FakeHostRoot(tmp_path, host).write()
    named = metadata_of(host)
    early = host.pods[0].uid
    unnamed = {**named, early: replace(named[early], containers={})}
    collection = make_collection(root, metadata=unnamed)
    await collection.run_once()
    got = samples(collection.exposition.text)
    pods = {dict(k)["pod_uid"] for (n, k) in got if ("pod_uid" in dict(k))}
    assert early not in pods and pods == {p.uid for p in host.pods[1:]}
    collection = make_collection(root, metadata=named)
    await collection.run_once()
    got = samples(collection.exposition.text)
    assert {dict(k)["pod_uid"] for (n, k) in got if "pod_uid" in dict(k)} == {
        p.uid for p in host.pods
    }

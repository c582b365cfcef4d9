"""The exporter on this very machine, default flags, real /proc and /sys: its per-node
values equal what /sys says at the same moment."""

from __future__ import annotations

import glob
import os
import re
import socket

from numaguard.contract.catalogue import NUMASTAT
from numaguard.simulator.parts.processes import exporter_process, get
from tests.conftest import samples

NODE_DIR = "/sys/devices/system/node"


def sys_nodes() -> list[int]:
    return sorted(int(re.search(r"\d+$", p)[0]) for p in glob.glob(f"{NODE_DIR}/node[0-9]*"))


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def meminfo_bytes(node: int, key: str) -> int:
    for line in read(f"{NODE_DIR}/node{node}/meminfo").splitlines():
        fields = line.split()
        if fields[2] == f"{key}:":
            return int(fields[3]) * 1024
    raise KeyError(key)


def numastat(node: int) -> dict[str, int]:
    return {
        k: int(v)
        for k, v in (line.split() for line in read(f"{NODE_DIR}/node{node}/numastat").splitlines())
    }


async def test_default_flags_match_sysfs():
    # The first cycle runs at start-up and the next one only after 15 s, so the scrape
    # shows counters read between these two readings.
    before = {n: numastat(n) for n in sys_nodes()}
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "KUBERNETES_SERVICE_HOST")}
    async with exporter_process(env=env) as (url, _):
        got = samples(await get(f"{url}/metrics"))
        after = {n: numastat(n) for n in sys_nodes()}
        free_now = {n: meminfo_bytes(n, "MemFree") for n in sys_nodes()}

    node_name = socket.gethostname()

    def value(name, **labels):
        return got[name, frozenset({"node": node_name, **labels}.items())]

    nodes = sys_nodes()
    assert nodes, "this machine has no NUMA node directory"
    exported_nodes = {dict(k[1])["numa_node"] for k in got if k[0] == "numaguard_numa_node_info"}
    assert exported_nodes == {str(n) for n in nodes}
    for n in nodes:
        numa = str(n)
        cpulist = read(f"{NODE_DIR}/node{n}/cpulist").strip()
        assert value("numaguard_numa_node_info", numa_node=numa, cpulist=cpulist) == 1
        cpus = [
            c
            for c in glob.glob("/sys/devices/system/cpu/cpu[0-9]*")
            if os.path.exists(f"{c}/topology/physical_package_id")
        ]
        on_node = [c for c in cpus if os.path.exists(f"{NODE_DIR}/node{n}/{os.path.basename(c)}")]
        sockets = {}
        for c in on_node:
            sock = read(f"{c}/topology/physical_package_id").strip()
            sockets[sock] = sockets.get(sock, 0) + 1
        for sock, count in sockets.items():
            assert value("numaguard_numa_node_cpus", numa_node=numa, socket=sock) == count
        distances = read(f"{NODE_DIR}/node{n}/distance").split()
        for target, d in zip(nodes, distances, strict=True):
            assert value(
                "numaguard_numa_node_distance", numa_node=numa, target_numa_node=str(target)
            ) == int(d)
        assert value("numaguard_numa_node_memory_total_bytes", numa_node=numa) == meminfo_bytes(
            n, "MemTotal"
        )
        # free memory moves all the time: same value within 2% of the node, read just after
        exported_free = value("numaguard_numa_node_memory_free_bytes", numa_node=numa)
        assert abs(exported_free - free_now[n]) < 0.02 * meminfo_bytes(n, "MemTotal")
        for kind in ("numa_hit", "local_node", "other_node", "numa_miss"):
            exported = value(NUMASTAT[kind].name, numa_node=numa)
            assert before[n][kind] <= exported <= after[n][kind]
    vmstat = dict(line.split() for line in read("/proc/vmstat").splitlines())
    if "numa_hint_faults" in vmstat:
        assert value("numaguard_numa_balancing_hint_faults_total") <= int(
            vmstat["numa_hint_faults"]
        )
    assert value("numaguard_collector_success", collector="host_numa") == 1
    # no kubepods here: the pod collector runs, finds nothing, and is healthy
    assert value("numaguard_collector_success", collector="pod_placement") == 1
    assert not [
        k
        for k in got
        if k[0].startswith("numaguard_pod_") and k[0] != "numaguard_pod_metadata_synced"
    ]

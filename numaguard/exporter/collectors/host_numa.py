"""Host NUMA metrics: nodes, CPUs by socket, distances, memory, allocation counters."""

from __future__ import annotations

from numaguard.contract import catalogue as c
from numaguard.exporter.collectors import Collector
from numaguard.exporter.exposition import Family
from numaguard.exporter.model import NodeSnapshot
from numaguard.exporter.readers import format_id_list


def families(snap: NodeSnapshot) -> list[Family]:
    node = snap.node_name
    info, cpus, distance = (
        Family(m, node) for m in (c.NUMA_NODE_INFO, c.NUMA_NODE_CPUS, c.NUMA_NODE_DISTANCE)
    )
    total, free, used = (
        Family(m, node) for m in (c.NUMA_MEMORY_TOTAL, c.NUMA_MEMORY_FREE, c.NUMA_MEMORY_USED)
    )
    pages = {kind: Family(spec, node) for kind, spec in c.NUMASTAT.items()}
    remote = Family(c.NUMA_REMOTE_ALLOC, node)
    for n in snap.numa_nodes:
        numa = str(n.id)
        if n.cpus is not None:
            info.add(1, numa, format_id_list(n.cpus))
        for socket, count in sorted(n.cpus_by_socket.items()):
            cpus.add(count, numa, str(socket))
        if n.meminfo:
            total.add(n.meminfo.total_bytes, numa)
            free.add(n.meminfo.free_bytes, numa)
            used.add(n.meminfo.used_bytes, numa)
        for kind, value in (n.numastat or {}).items():
            if kind in pages:  # a counter a newer kernel adds is not in the catalogue
                pages[kind].add(value, numa)
        if n.remote_alloc_ratio is not None:
            remote.add(n.remote_alloc_ratio, numa)
    if snap.topology:
        for a, row in snap.topology.distance.items():
            for b, d in row.items():
                distance.add(d, str(a), str(b))
    out = [info, cpus, distance, total, free, used, *pages.values(), remote]
    for spec, key in (
        (c.HINT_FAULTS, "numa_hint_faults"),
        (c.HINT_FAULTS_LOCAL, "numa_hint_faults_local"),
        (c.PAGES_MIGRATED, "numa_pages_migrated"),
    ):
        if key in snap.balancing:
            fam = Family(spec, node)
            fam.add(snap.balancing[key])
            out.append(fam)
    if snap.topology and snap.topology.smt_active is not None:
        fam = Family(c.NODE_SMT_ACTIVE, node)
        fam.add(int(snap.topology.smt_active))
        out.append(fam)
    if snap.topology and snap.topology.cpus_per_core is not None:
        fam = Family(c.NODE_CPUS_PER_CORE, node)
        fam.add(snap.topology.cpus_per_core)
        out.append(fam)
    if snap.hint_fault_locality is not None:
        fam = Family(c.HINT_LOCALITY, node)
        fam.add(snap.hint_fault_locality)
        out.append(fam)
    return out


COLLECTOR = Collector(
    name="host_numa",
    help="NUMA topology, memory, allocation locality and balancing counters (sysfs, procfs)",
    source="numaguard.exporter.sources.host",
    families=families,
    reading="host",
)

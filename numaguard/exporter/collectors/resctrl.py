"""Memory-traffic and LLC metrics from resctrl: per L3 domain, NUMA node and pod."""

from __future__ import annotations

from numaguard.contract import catalogue as c
from numaguard.exporter.collectors import Collector
from numaguard.exporter.exposition import Families, Family, LabelPrefix
from numaguard.exporter.model import NodeSnapshot
from numaguard.exporter.model.traffic import Traffic
from numaguard.exporter.readers import format_id_list
from numaguard.exporter.records import READ_FAILURES


def families(snap: NodeSnapshot) -> list[Family]:
    """Turned off (--no-collector.resctrl), it says so."""
    f = Families("resctrl", snap.node_name, snap.detail)
    add = f.add
    running = COLLECTOR.name in snap.readings
    state = snap.resctrl if running else None
    mode = state.mode if state else "unavailable" if running else "off"
    add(c.RESCTRL_AVAILABLE, int(bool(state and state.available)))
    add(c.RESCTRL_MODE, 1, mode)
    if state is None or not state.available:
        return list(f.values())

    if state.num_rmids is not None and state.rmids_used is not None:
        add(c.RESCTRL_RMIDS, state.rmids_used, "used")
        not_used = max(0, state.num_rmids - state.rmids_used)
        if state.rmids_in_limbo:  # none free until the kernel lets them go
            add(c.RESCTRL_RMIDS, 0, "free")
            add(c.RESCTRL_RMIDS, not_used, "limbo")
        else:
            add(c.RESCTRL_RMIDS, not_used, "free")
    add(c.RESCTRL_UNMONITORED, len(state.unmonitored))
    add(c.RESCTRL_EXHAUSTIONS, state.rmid_exhaustions_total)
    for reason in ("unavailable", "error", "unassigned"):
        add(c.RESCTRL_UNREADABLE, state.unreadable_total.get(reason, 0), reason)

    for d, (counters, free) in state.mbm_counters.items():
        add(c.RESCTRL_MBM_COUNTERS, counters - free, str(d), "used")
        add(c.RESCTRL_MBM_COUNTERS, free, str(d), "free")
    for d in state.domains:
        domain = str(d.id)
        if state.mbm_counters:
            add(c.RESCTRL_MBM_PARTIAL, int(d.id in state.partial_domains), domain)
        add(
            c.L3_INFO,
            1,
            domain,
            ",".join(map(str, d.sockets)),
            ",".join(map(str, d.numa_nodes)),
            format_id_list(d.cpus),
        )
        add(c.L3_CAPACITY, d.capacity_bytes, domain)
        _traffic(
            add,
            d.traffic,
            domain,
            c.L3_TRAFFIC,
            c.L3_TRAFFIC_LOCAL,
            c.L3_OCCUPANCY,
            c.L3_BANDWIDTH,
            c.L3_REMOTE,
        )
    for node, t in state.numa_nodes.items():
        _traffic(
            add,
            t,
            str(node),
            c.NUMA_TRAFFIC,
            c.NUMA_TRAFFIC_LOCAL,
            c.NUMA_OCCUPANCY,
            c.NUMA_BANDWIDTH,
            c.NUMA_REMOTE_TRAFFIC,
        )
    _pods(f, snap)
    return list(f.values())


def _pods(f: Families, snap: NodeSnapshot) -> None:
    """Each monitored pod's traffic and LLC use per L3 domain."""
    state = snap.resctrl
    for pod in snap.pods:
        labels = LabelPrefix(c.POD, (pod.namespace, pod.name, pod.uid))
        traffic = state.pods.get(pod.uid)
        unmonitored = pod.uid in state.unmonitored
        if traffic is None and not unmonitored:
            continue
        f[c.POD_MONITORED.name].add_under(labels, 0 if unmonitored else 1)
        if traffic is None:
            continue
        for d, t in traffic.domains.items():
            for spec, value in (
                (c.POD_TRAFFIC, t.total_bytes),
                (c.POD_TRAFFIC_LOCAL, t.local_bytes),
                (c.POD_OCCUPANCY, t.occupancy_bytes),
                (c.POD_LLC_SHARE, traffic.llc_share.get(d)),
            ):
                if value is not None:
                    f[spec.name].add_under(labels, value, str(d))
        if traffic.bytes_per_second is not None:
            f[c.POD_BANDWIDTH.name].add_under(labels, traffic.bytes_per_second)
        if traffic.remote_ratio is not None:
            f[c.POD_REMOTE_TRAFFIC.name].add_under(labels, traffic.remote_ratio)


def _traffic(add, t: Traffic, label: str, total, local, occupancy, bandwidth, remote) -> None:
    add(total, t.total_bytes, label)
    add(local, t.local_bytes, label)
    add(occupancy, t.occupancy_bytes, label)
    add(bandwidth, t.bytes_per_second, label)
    add(remote, t.remote_ratio, label)


COLLECTOR = Collector(
    name="resctrl",
    help="memory traffic and LLC occupancy per L3 domain, NUMA node and pod (resctrl; needs "
    "pod_placement for the pods)",
    source="numaguard.exporter.sources.resctrl",
    families=families,
    reading="resctrl",
    reads=("pod_placement",),
    errors=(*READ_FAILURES, "write"),
)

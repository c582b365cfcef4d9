"""What a fix gained, as a real Prometheus (2 and 3) answers the activity queries over a
backfilled history: a pod fed across sockets on one slice, evicted, and its replacement
on another slice of the same profile that sat idle before the replacement got it."""

from __future__ import annotations

import time

import aiohttp
import pytest

from numaguard.contract import catalogue as c
from numaguard.remediator.core import queries as q
from numaguard.remediator.core.outcome import activities, gain
from numaguard.remediator.signals import Prometheus
from numaguard.simulator.parts.processes import free_port
from numaguard.simulator.parts.prometheus import VERSIONS, PrometheusServer, tsdb_blocks

pytestmark = pytest.mark.prometheus

STEP = 5  # seconds between samples
NODE, INSTANCE = "gpu-1", "gpu-1:9847"
TARGET = {"job": "numaguard", "instance": INSTANCE, "node": NODE}
GPU = {"gpu": "1", "gpu_uuid": "GPU-1"}
OLD, NEW = "old-pod-1", "new-pod-1"
ACTION, STARTED = 1200, 600  # seconds before the end: the eviction, the replacement's start


def series(end: float) -> list[tuple[str, dict, float, float, object]]:
    """(metric, labels, from, to, value or value(t)), times in seconds before ``end``."""
    out = []
    for mig, start, value in (("MIG-b", 3600, lambda t: 0.1), ("MIG-a", 3600, None)):
        sl = {**TARGET, **GPU, "mig_uuid": mig, "mig_profile": "1g.10gb"}
        # MIG-a idles until the replacement runs on it, then is busy at 0.8
        busy = value or (lambda t: 0.8 if t <= STARTED else 0.0)
        out.append((c.MIG_UTILIZATION.name, {**sl, "kind": "sm"}, start, 0, busy))
        out.append((c.MIG_SMS.name, sl, start, 0, lambda t: 16))
    for uid, mig, numa, remote, alive in (
        (OLD, "MIG-b", "1", 0.2, (3600, ACTION)),
        (NEW, "MIG-a", "0", 0.0, (STARTED, 0)),
    ):
        pod = {**TARGET, "namespace": "ml", "pod": uid, "pod_uid": uid}
        ctr = {**pod, "container": "main", "container_id": f"c-{uid}"}
        holder = {
            **TARGET,
            **GPU,
            "mig_uuid": mig,
            "resource": "nvidia.com/mig-1g.10gb",
            "numa_node": "0",
            **{k: v for k, v in ctr.items() if k not in TARGET},
            "source": "kubelet",
        }
        out.append((c.GPU_HOLDER.name, holder, *alive, lambda t: 1))
        out.append((c.POD_EXCLUSIVE_CPUS.name, {**pod, "numa_node": numa}, *alive, lambda t: 4))
        out.append((c.POD_REMOTE_MEMORY.name, pod, *alive, lambda t, r=remote: r))
        # a quarter of the time some task stalled on CPU: 0.25 s a second
        out.append((c.POD_PRESSURE["cpu"].name, pod, *alive, lambda t: (3600 - t) * 0.25))
    return out


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory):
    end = float(int(time.time()))
    d = tmp_path_factory.mktemp("outcome")
    families: dict[str, list] = {}  # OpenMetrics: a family's series together
    for metric, *rest in series(end):
        families.setdefault(metric, []).append(rest)
    with (d / "history.om").open("w") as out:
        for metric, members in families.items():
            out.write(f"# TYPE {metric} gauge\n")
            for labels, start, stop, value in members:
                inside = ",".join(f'{k}="{v}"' for k, v in labels.items())
                for ago in range(start, stop - 1, -STEP):
                    out.write(f"{metric}{{{inside}}} {value(ago)} {end - ago:.3f}\n")
        out.write("# EOF\n")
    return tsdb_blocks(d / "history.om"), end


@pytest.mark.parametrize("version", VERSIONS)
async def test_the_gain_is_measured_over_the_instants_each_pod_held_its_device(backfilled, version):
    blocks, end = backfilled
    async with (
        PrometheusServer([], free_port(), version=version, blocks=blocks) as prom,
        aiohttp.ClientSession() as session,
    ):
        prometheus = Prometheus(prom.url, session)
        period = 900.0

        async def measured(uid: str, at: float):
            pods = [(NODE, uid)]
            asked = q.activity_expressions(pods, period)
            signals = await prometheus.fetch_set(asked, q.ACTIVITY_LABELS, at)
            return activities(signals, pods, {NODE: INSTANCE})[uid]

        before = await measured(OLD, end - ACTION)
        assert (before.gpu, before.sms, before.devices) == (pytest.approx(0.1), 16, "1g.10gb")
        assert (before.numa_nodes, before.remote_memory) == ("1", pytest.approx(0.2))
        assert before.cpu_pressure == pytest.approx(0.25, rel=0.05)
        # the period reaches 300 s back before the replacement held its slice, when the
        # slice sat idle: those instants are not the replacement's
        after = await measured(NEW, end)
        assert after.gpu == pytest.approx(0.8) and after.numa_nodes == "0"
        assert after.remote_memory == 0.0
        g = gain(before, after)
        assert g.ratio == pytest.approx(8.0) and g.detail == "GPU activity 0.10 -> 0.80"
        # a target of another job saying the same of the pod is not read at all
        forged = q.activity_expressions([(NODE, NEW)], period, 'job="other"')
        signals = await prometheus.fetch_set(forged, q.ACTIVITY_LABELS, end)
        assert all(signals[name].empty for name in q.ACTIVITY_LABELS)

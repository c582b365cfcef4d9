"""What the remediator reads from the API server, through the real client as its
ServiceAccount against the real control plane: owners followed by uid, the history kept
on the workload, phase and requested devices; and the actuator's writes: history before
the action, nothing at all without leadership. An owner re-made under its name (a state
a real cluster shows until its garbage collector catches up) comes from the proxy."""

from __future__ import annotations

import json

import pytest

from numaguard.contract.names import HISTORY_ANNOTATION, PENDING_LABEL
from numaguard.remediator.actuator import Actuator
from numaguard.remediator.cluster import pending_workloads, pods_of, workload_pods
from numaguard.remediator.core.actions import Action
from numaguard.remediator.core.findings import Finding
from numaguard.remediator.core.history import Pending, WorkloadHistory
from numaguard.remediator.core.needs import Need
from numaguard.remediator.core.rejections import RejectedPod
from numaguard.remediator.kube import Kube, api_client
from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.fakes import presets

pytestmark = pytest.mark.cluster

NOW = 1_800_000_000.0
NODE = "gpu-node-3"


class Api:
    def __init__(self, sim: SimulatedCluster, proxy) -> None:
        self.sim, self.cp, self.proxy = sim, sim.cp, proxy

    async def get(self, kind: str, name: str) -> dict | None:
        return await self.cp.get(self.sim.session, kind, "ml", name)

    async def patch(self, kind: str, name: str, patch: dict) -> dict:
        return await self.cp.patch(self.sim.session, kind, "ml", name, patch)

    async def uid(self, name: str) -> str:
        return (await self.get("Pod", name))["metadata"]["uid"]

    async def finding(self, name: str, uid: str | None = None) -> Finding:
        uid = uid or await self.uid(name)
        return Finding("cross_numa", NODE, "ml", name, uid, "device_remote", instance="i")

    async def events(self) -> list[dict]:
        return await self.cp.items(self.sim.session, "Event", "ml")

    def writes(self) -> list:
        return self.proxy.writes()


@pytest.fixture
async def api(tmp_path, control_plane):
    cp = control_plane
    sim = SimulatedCluster(str(tmp_path / "cluster"), cp)
    sim.add_node(NODE, *presets.gpu_node(), "single-numa-node")
    await sim.start()
    try:
        async with cp.fault_proxy() as proxy:
            account = "numaguard-remediator"
            kubeconfig = cp.kubeconfig(
                tmp_path / "kubeconfig", cp.tokens[account], account, server=proxy.url
            )
            client = await api_client(kubeconfig)
            try:
                yield Api(sim, proxy), Kube(client)
            finally:
                await client.close()
    finally:
        await sim.stop()


def re_made(name: str, plural: str, status: int = 200):
    """Answer GETs of ml/<plural>/<name> as if it had been deleted and made again."""

    def match(method: str, path: str) -> bool:
        return method == "GET" and path.split("?")[0].endswith(f"/ml/{plural}/{name}")

    def change(_, body: dict) -> tuple[int, dict]:
        if status == 404:
            return 404, {"kind": "Status", "code": 404, "reason": "NotFound"}
        return 200, {**body, "metadata": {**body["metadata"], "uid": "another"}}

    return match, change


async def test_owners_are_followed_by_uid(api):
    api, kube = api
    (info,) = (await pods_of(kube, [await api.finding("trainer")])).values()
    assert info.workload == "Deployment/ml/trainer" and not info.mismatch
    assert info.phase == "Running" and info.node == NODE
    assert info.resources == frozenset({"nvidia.com/gpu"})
    # the ReplicaSet was deleted and another made under its name: not the pod's owner
    api.proxy.rewrites = [re_made("trainer-preset", "replicasets")]
    (info,) = (await pods_of(kube, [await api.finding("trainer")])).values()
    assert "uid is not ReplicaSet trainer-preset's" in info.mismatch
    # and the same for a Deployment made again under its name
    api.proxy.rewrites = [re_made("trainer", "deployments")]
    (info,) = (await pods_of(kube, [await api.finding("trainer")])).values()
    assert "uid is not Deployment trainer's" in info.mismatch
    # an owner that is gone
    api.proxy.rewrites = [re_made("trainer-preset", "replicasets", status=404)]
    (info,) = (await pods_of(kube, [await api.finding("trainer")])).values()
    assert "does not exist" in info.mismatch


async def test_another_pod_of_the_same_name_is_not_the_one_found(api):
    api, kube = api
    assert await pods_of(kube, [await api.finding("trainer", uid="u1")]) == {}


async def test_history_is_read_back_and_garbage_is_never_a_fresh_start(api):
    api, kube = api
    history = WorkloadHistory(last_action=NOW, failures=3)
    annotations = {HISTORY_ANNOTATION: history.to_json()}
    await api.patch("Deployment", "trainer", {"metadata": {"annotations": annotations}})
    (info,) = (await pods_of(kube, [await api.finding("trainer")])).values()
    assert info.history == history and not info.mismatch
    annotations = {HISTORY_ANNOTATION: '{"failures": "lots"}'}
    await api.patch("Deployment", "trainer", {"metadata": {"annotations": annotations}})
    (info,) = (await pods_of(kube, [await api.finding("trainer")])).values()
    assert info.history is None and "unreadable history" in info.mismatch


class Leadership:
    """An elector that leads for the first ``writes`` checks, then has lost the Lease."""

    def __init__(self, writes: int) -> None:
        self.left = writes

    @property
    def leading(self) -> bool:
        self.left -= 1
        return self.left >= 0


async def test_in_dry_run_the_actuator_can_write_nothing_but_events(api, caplog):
    """Dry run is enforced by the writer the actuator gets, not by whoever plans: an
    action planned as acting (a planner's defect) is refused at the write, and so is
    every other write but an Event."""
    api, kube = api
    found = await api.finding("trainer")
    (pod,) = (await pods_of(kube, [found])).values()
    actuator = Actuator(kube, None, clock=lambda: NOW)  # dry run unless told otherwise
    before = len(api.writes())
    assert await actuator.act(Action("evict", found, pod, "evict: fits", False)) == "failed"
    assert await actuator.record("Deployment/ml/trainer", WorkloadHistory(NOW)) == "failed"
    rejected = RejectedPod(
        "ml", "trainer", pod.uid, NODE, "TopologyAffinityError", NOW, "", Need(1, 0, {})
    )
    assert await actuator.delete_rejected(rejected) == "failed"
    assert api.proxy.evictions() == []
    # sent: only the Events saying the action failed, on the pod and its workload
    assert [(e.method, e.path.rsplit("/", 1)[-1]) for e in api.writes()[before:]] == [
        ("POST", "events"),
        ("POST", "events"),
    ]
    refused = [r for r in caplog.records if getattr(r, "decision", "") == "refused_write"]
    assert [(r.method, r.path.rsplit("/", 1)[-1]) for r in refused] == [
        ("POST", "eviction"),
        ("PATCH", "trainer"),
        ("DELETE", "trainer"),
    ]
    await actuator.event(pod, "DryRun", "would evict: fits", "Normal")
    assert any(e["reason"] == "DryRun" for e in await api.events())


async def test_the_actuator_records_before_it_acts_and_never_writes_without_the_lease(api):
    api, kube = api
    found = await api.finding("trainer")
    (pod,) = (await pods_of(kube, [found])).values()
    action = Action("evict", found, pod, "evict: fits", False)
    intent = WorkloadHistory(
        last_action=NOW, pending=(Pending("cross_numa", "device_remote", NOW, found.pod_uid),)
    )
    actuator = Actuator(kube, Leadership(writes=100), clock=lambda: NOW, dry_run=False)
    assert await actuator.act(action, intent) == "evicted"
    deployment = await api.get("Deployment", "trainer")
    recorded = deployment["metadata"]["annotations"][HISTORY_ANNOTATION]
    assert json.loads(recorded) == json.loads(intent.to_json())
    assert deployment["metadata"]["labels"][PENDING_LABEL] == "true"
    writes = [(e.method, e.path.split("/")[-1]) for e in api.writes()]
    assert writes[:2] == [("PATCH", "trainer"), ("POST", "eviction")]  # the intent first
    assert api.proxy.evictions() == [("ml", "trainer", 201)]
    (listed,) = (await pending_workloads(kube)).items()
    assert listed[0] == "Deployment/ml/trainer" and listed[1][0] == intent
    # verified: the label goes, the history stays
    assert await actuator.record("Deployment/ml/trainer", WorkloadHistory(NOW)) == "ok"
    labels = (await api.get("Deployment", "trainer"))["metadata"].get("labels") or {}
    assert PENDING_LABEL not in labels
    assert await pending_workloads(kube) == {}

    # the Lease is lost after the history write: no eviction, and no Event about it
    found = await api.finding("infer-a")
    (pod,) = (await pods_of(kube, [found])).values()
    action = Action("evict", found, pod, "evict: fits", False)
    before, events = len(api.writes()), len(await api.events())
    late = Actuator(kube, Leadership(writes=2), clock=lambda: NOW, dry_run=False)
    assert await late.act(action, intent) == "not_leader"
    assert api.proxy.evictions()[1:] == []
    writes = api.writes()[before:]
    assert [e.method for e in writes] == ["PATCH"]  # only the intent
    await late.event(pod, "Anything", "said after the Lease was lost", "Normal")
    assert len(api.writes()) == before + 1 and len(await api.events()) == events


async def test_the_pods_of_a_workload_by_its_selector_and_owner(api):
    api, kube = api
    # a pod with the workload's labels but not its owner's: not one of its pods
    stranger = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer-look-alike", "namespace": "ml", "labels": {"app": "trainer"}},
        "spec": {"containers": [{"name": "main", "image": "x:1"}], "nodeName": NODE},
    }
    await api.cp.create(api.sim.session, stranger)
    await api.sim.wait_until(lambda: api.sim.running("trainer-look-alike"), "stranger runs")
    obj = await api.get("Deployment", "trainer")
    pods = await workload_pods(kube, "Deployment/ml/trainer", obj)
    assert sorted((p.name, p.phase) for p in pods) == [("trainer", "Running")]


async def test_an_eviction_names_its_pod_by_uid(api):
    api, kube = api
    found = await api.finding("trainer")
    (pod,) = (await pods_of(kube, [found])).values()
    # the pod was replaced by another of the same name since it was read
    old = await api.get("Pod", "trainer")
    await api.cp.request(api.sim.session, "DELETE", "/api/v1/namespaces/ml/pods/trainer")

    async def gone(_) -> bool:  # the kubelet confirmed it and the API server let it go
        return await api.get("Pod", "trainer") is None

    await api.sim.wait_for_api(gone, "trainer deleted")
    again = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "ml"},
        "spec": {**old["spec"], "nodeName": NODE},
    }
    await api.cp.create(api.sim.session, again)
    action = Action("evict", found, pod, "evict: fits", False)
    assert await Actuator(kube, None, dry_run=False).act(action) == "gone"
    assert api.proxy.evictions() == [("ml", "trainer", 409)]  # the API server's answer
    assert (await api.get("Pod", "trainer"))["metadata"]["uid"] != found.pod_uid

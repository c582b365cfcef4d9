"""The request to move a pod's memory home, on the real API server: the remediator's
actuator writes it as its ServiceAccount (deploy/'s RBAC), on that pod only (its uid);
deploy/components/memory-mover's ValidatingAdmissionPolicy refuses it from anyone else,
a tenant allowed to patch its own pods included."""

from __future__ import annotations

import contextlib

import aiohttp
import pytest

from numaguard.exporter.memory_mover import REQUEST, REQUEST_ANNOTATION
from numaguard.remediator.actuator import Actuator
from numaguard.remediator.core.planner import PodInfo
from numaguard.remediator.kube import Kube, api_client
from numaguard.simulator.controlplane import ApiError, path_of, rendered
from numaguard.simulator.processes import until

pytestmark = pytest.mark.cluster

NS = "move-request"
TENANT = "tenant"
REFUSED = "only numaguard's remediator may write the numaguard.io/move-memory annotation"


def pod(name: str, annotations: dict | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


async def tenant_token(cp, session, namespace: str = NS) -> str:
    """A ServiceAccount that may create and patch the pods of ``namespace`` (made if
    need be)."""
    objects = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": TENANT}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": TENANT},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": TENANT},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TENANT},
            "subjects": [{"kind": "ServiceAccount", "name": TENANT, "namespace": namespace}],
        },
    ]
    for obj in objects:
        if obj["kind"] != "Namespace":
            obj["metadata"]["namespace"] = namespace
        with contextlib.suppress(ApiError):  # made already
            await cp.create(session, obj)
    return await cp.service_account_token(session, namespace, TENANT)


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

            # the remediator asks, on that pod, with a value the exporter reads
            current = await cp.get(session, "Pod", NS, "job")
            uid = current["metadata"]["uid"]
            target = PodInfo(NS, "job", uid, "", 0.0)
            actuator = Actuator(Kube(client), None, clock=lambda: 1_800_000_000.4)
            assert await actuator._move_memory(target) == "requested"
            asked = (await cp.get(session, "Pod", NS, "job"))["metadata"]["annotations"]
            assert asked == {"team": "ml", REQUEST_ANNOTATION: "1800000000"}
            assert REQUEST.fullmatch(asked[REQUEST_ANNOTATION])
            # the tenant can neither change nor remove what the remediator wrote
            for value in ("1800000001", None):
                status, body = await patch({REQUEST_ANNOTATION: value})
                assert status == 403 and REFUSED in body["message"], body
            # a pod made since under the same name is not asked (the uid precondition)
            other = PodInfo(NS, "job", "00000000-0000-0000-0000-000000000000", "", 0.0)
            assert await actuator._move_memory(other) == "gone"
            gone = PodInfo(NS, "no-such-pod", uid, "", 0.0)
            assert await actuator._move_memory(gone) == "gone"
            assert (await cp.get(session, "Pod", NS, "job"))["metadata"]["annotations"] == asked
        finally:
            await client.close()
            for name in ("job", "asks"):
                await cp.request(
                    session, "DELETE", path_of("Pod", NS, name) + "?gracePeriodSeconds=0"
                )
            for obj in rendered("memory-mover"):
                if obj["kind"].startswith("ValidatingAdmissionPolicy"):
                    kind, name = obj["kind"], obj["metadata"]["name"]
                    await cp.request(session, "DELETE", path_of(kind, None, name))

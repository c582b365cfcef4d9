"""deploy/'s RBAC against a real kube-apiserver's RBAC authorizer (the control plane built
from its pinned Go modules): each component's ServiceAccount may do exactly what its
code uses (the API_USE tables), nothing this test tries beyond that, and a verb taken
out of the shipped ClusterRole makes the remediator's call fail with the server's 403."""

from __future__ import annotations

import types
from pathlib import Path

import aiohttp
import pytest
import yaml

from numaguard.exporter.sources.kube import API_USE as EXPORTER_API_USE
from numaguard.remediator.actuator import Actuator, Writer
from numaguard.remediator.kube import API_USE as REMEDIATOR_API_USE
from numaguard.remediator.kube import Kube, api_client
from numaguard.simulator.parts.processes import until
from tests.helpers.control_plane import allowed

pytestmark = pytest.mark.cluster

DEPLOY = Path(__file__).parent.parent / "deploy" / "base"


async def test_the_shipped_rbac_grants_exactly_what_the_code_uses(control_plane):
    cp = control_plane  # deploy/'s namespace and RBAC applied as they ship
    async with aiohttp.ClientSession() as session:
        for account, uses in (
            ("numaguard-remediator", REMEDIATOR_API_USE),
            ("numaguard-exporter", EXPORTER_API_USE),
        ):
            for group, resource, verb in sorted(uses):
                # leases only in its own namespace; everything else wherever pods run
                ns = "numaguard" if resource == "leases" else "ml"
                assert await allowed(cp, session, account, group, resource, verb, ns), (
                    account,
                    group,
                    resource,
                    verb,
                )
        for account, group, resource, verb, ns in (
            # it deletes pods the kubelet refused, evicts the others, patches one's move
            # request: never makes or replaces one
            ("numaguard-remediator", "", "pods", "create", "ml"),
            ("numaguard-remediator", "", "pods", "update", "ml"),
            ("numaguard-remediator", "", "secrets", "get", "ml"),
            ("numaguard-remediator", "apps", "deployments", "delete", "ml"),
            ("numaguard-remediator", "apps", "daemonsets", "patch", "ml"),
            ("numaguard-remediator", "coordination.k8s.io", "leases", "update", "kube-system"),
            ("numaguard-exporter", "", "pods", "get", "ml"),
            ("numaguard-exporter", "", "pods/eviction", "create", "ml"),
            ("numaguard-exporter", "", "secrets", "list", "ml"),
        ):
            assert not await allowed(cp, session, account, group, resource, verb, ns), (
                account,
                resource,
                verb,
                ns,
            )
        # and the authorizer is real: the admin may, an unknown token may not
        status, _ = await cp.request(session, "GET", "/api/v1/namespaces/numaguard")
        assert status == 200
        status, _ = await cp.request(session, "GET", "/api/v1/namespaces", token="forged")
        assert status == 401


async def test_a_service_account_token_is_refused_what_its_role_does_not_grant(control_plane):
    cp = control_plane
    token = cp.tokens["numaguard-remediator"]
    async with aiohttp.ClientSession() as session:
        status, _ = await cp.request(session, "GET", "/api/v1/pods", token=token)
        assert status == 200  # list pods: granted
        status, body = await cp.request(session, "GET", "/api/v1/secrets", token=token)
        assert status == 403 and body["reason"] == "Forbidden"
        path = "/apis/apps/v1/namespaces/default/deployments/any"
        status, body = await cp.request(session, "DELETE", path, token=token)
        assert status == 403, body  # it patches workloads, never deletes one


async def test_without_the_eviction_verb_the_remediator_s_eviction_gets_403(
    control_plane, tmp_path
):
    """Take pods/eviction create out of the enforce overlay's ClusterRole (the base has
    none): the remediator's own eviction is refused by the real authorizer (and then
    allowed again)."""
    cp = control_plane
    enforce = DEPLOY.parent / "components" / "no-dry-run" / "remediator-enforce-rbac.yaml"
    (role,) = [o for o in yaml.safe_load_all(enforce.read_text()) if o["kind"] == "ClusterRole"]
    path = f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role['metadata']['name']}"
    without = [r for r in role["rules"] if r["resources"] != ["pods/eviction"]]
    assert len(without) == len(role["rules"]) - 1
    kubeconfig = cp.kubeconfig(
        tmp_path / "kubeconfig", cp.tokens["numaguard-remediator"], "numaguard-remediator"
    )
    client = await api_client(kubeconfig)
    pod = types.SimpleNamespace(namespace="default", name="nobody", uid="0")

    async def may_evict(session) -> bool:
        return await allowed(
            cp, session, "numaguard-remediator", "", "pods/eviction", "create", "default"
        )

    eviction = ("/api/v1/namespaces/default/pods/nobody/eviction", {"kind": "Eviction"})
    async with aiohttp.ClientSession() as session:
        try:
            await cp.call(session, "PATCH", path, {"rules": without})
            await until(lambda: refused(may_evict(session)), "the verb gone from the authorizer")
            answer = await Writer(Kube(client), acting=True).post(*eviction)
            assert answer.status == 403 and answer.body["reason"] == "Forbidden"
            assert await Actuator(Kube(client), None, dry_run=False)._evict(pod) == "failed"
        finally:
            await cp.call(session, "PATCH", path, {"rules": role["rules"]})
        await until(lambda: may_evict(session), "the verb back in the authorizer")
        try:  # as shipped: allowed (there is no such pod)
            assert await Actuator(Kube(client), None, dry_run=False)._evict(pod) == "gone"
        finally:
            await client.close()


async def refused(review) -> bool:
    """The authorizer's role cache follows a watch: whether it says no yet."""
    return not await review

"""deploy/'s RBAC against a real kube-apiserver's RBAC authorizer (etcd and kube-apiserver
built from their pinned Go modules): each component's ServiceAccount may do exactly
what its code uses (the API_USE tables), and nothing this test tries beyond that."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
import yaml

from exporter.sources.kube import API_USE as EXPORTER_API_USE
from remediator.kube import API_USE as REMEDIATOR_API_USE
from simulator.controlplane import ControlPlane

DEPLOY = Path(__file__).parent.parent / "deploy" / "base"
# kind -> (API path prefix, plural, namespaced)
PATHS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
}


async def apply(cp: ControlPlane, session, obj: dict) -> None:
    prefix, plural, namespaced = PATHS[obj["kind"]]
    ns = obj["metadata"].get("namespace")
    path = f"{prefix}/namespaces/{ns}/{plural}" if namespaced else f"{prefix}/{plural}"
    status, body = await cp.request(session, "POST", path, obj)
    assert status == 201, (obj["kind"], obj["metadata"]["name"], body)


async def allowed(cp: ControlPlane, session, account: str, group, resource, verb, ns) -> bool:
    """A SubjectAccessReview for the ServiceAccount, as the authorizer answers it."""
    resource, _, sub = resource.partition("/")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:numaguard:{account}",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:numaguard"],
            "resourceAttributes": {
                "group": group,
                "resource": resource,
                "subresource": sub,
                "verb": verb,
                "namespace": ns,
            },
        },
    }
    status, body = await cp.request(
        session, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review
    )
    assert status == 201, body
    return body["status"]["allowed"]


@pytest.mark.timeout(300)
async def test_the_shipped_rbac_grants_exactly_what_the_code_uses():
    async with ControlPlane() as cp, aiohttp.ClientSession() as session:
        for name in ("namespace.yaml", "exporter-rbac.yaml", "remediator-rbac.yaml"):
            for obj in yaml.safe_load_all((DEPLOY / name).read_text()):
                await apply(cp, session, obj)
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
            ("numaguard-remediator", "", "pods", "delete", "ml"),  # evictions only
            ("numaguard-remediator", "", "pods", "patch", "ml"),
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

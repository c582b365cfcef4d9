"""What the real control plane's RBAC allows a ServiceAccount (kubectl auth can-i)."""

from __future__ import annotations

from numaguard.simulator.parts.controlplane import ControlPlane


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

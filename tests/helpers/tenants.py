"""A namespace's own users on the real control plane: an admin of one namespace and a
tenant's token."""

from __future__ import annotations

import contextlib

from numaguard.simulator.parts.controlplane import (
    ApiError,
)

NS = "move-request"


TENANT = "tenant"


def namespace_admin(namespace: str, name: str = TENANT) -> list[dict]:
    """A ServiceAccount of ``namespace`` that may do anything to anything there, as many
    teams' are, with its Role and RoleBinding."""
    meta = {"name": name, "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


async def tenant_token(cp, session, namespace: str = NS) -> str:
    """The token of a namespace's admin (made if need be)."""
    namespace_object = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    for obj in (namespace_object, *namespace_admin(namespace)):
        with contextlib.suppress(ApiError):  # made already
            await cp.create(session, obj)
    return await cp.service_account_token(session, namespace, TENANT)

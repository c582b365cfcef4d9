"""A thin layer over the official client's asyncio API (``kubernetes.aio``): requests
made at its lower level (its own credentials, TLS and timeouts) with plain JSON in and
out, so that every answer's status code is seen as it is (201, 409, 429, 500...).

It offers reads only; every write goes through the actuator's Writer."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from kubernetes.aio import client, config
from kubernetes.utils import parse_quantity  # noqa: F401 (the client's, for cluster.py)

from numaguard.common.apiserver import KubeconfigError, find_kubeconfig, in_cluster

REQUEST_TIMEOUT_SECONDS = 15.0
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


async def api_client(kubeconfig: str | None) -> client.ApiClient | None:
    """An API client from the kubeconfig kubectl would use, or the in-cluster service
    account, or None."""
    kubeconfig = find_kubeconfig(kubeconfig)
    if kubeconfig and not os.path.isfile(kubeconfig):
        # the client library would say "Expected key current-context"
        raise KubeconfigError(f"{kubeconfig}: no such file (--kubeconfig or $KUBECONFIG)")
    try:
        if kubeconfig:
            return await config.new_client_from_config(config_file=kubeconfig)
        if in_cluster():
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
    except Exception as err:  # YAML, missing keys, unreadable token: all mean the same
        where = kubeconfig or "the in-cluster service account"
        raise KubeconfigError(f"{where}: {err}") from None
    return None


# Every (API group, resource, verb) the remediator uses; deploy/ grants exactly these:
# deploy/base what a dry run needs (it reads, tells in Events and elects a leader), the
# no-dry-run component the writes that act.
DRY_RUN_API_USE = {
    ("", "pods", "get"),
    ("", "pods", "list"),  # a workload's pods, to verify a fix on its replacements
    ("", "events", "create"),
    ("", "nodes", "get"),  # where a replacement may be scheduled (core/reach.py)
    ("", "nodes", "list"),  # the MIG manager's nodes, their GPUs and configs (relayouts.py)
    # get: owners and their history; list: those with actions awaiting verification
    ("apps", "replicasets", "get"),
    ("apps", "replicasets", "list"),
    ("apps", "deployments", "get"),
    ("apps", "deployments", "list"),
    ("apps", "statefulsets", "get"),
    ("apps", "statefulsets", "list"),
    # the MIG profile a pod's ResourceClaims select; list: templates a resize replaced,
    # and what still makes pods from them before one is deleted
    ("resource.k8s.io", "resourceclaims", "get"),
    ("apps", "daemonsets", "list"),
    ("batch", "jobs", "list"),
    ("batch", "cronjobs", "list"),
    ("resource.k8s.io", "resourceclaimtemplates", "get"),
    ("resource.k8s.io", "resourceclaimtemplates", "list"),
    # the extended resources DeviceClasses map, for a pod whose slice is DRA's behind one
    ("resource.k8s.io", "deviceclasses", "list"),
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
}
ENFORCE_API_USE = {
    ("", "pods/eviction", "create"),
    ("", "pods", "delete"),  # pods the kubelet refused for alignment, beyond the few kept
    ("", "pods", "patch"),  # a pod's request that its node move its memory home
    # the history, and opt-in MIG resizes of Deployments and StatefulSets
    ("apps", "replicasets", "patch"),
    ("apps", "deployments", "patch"),
    ("apps", "statefulsets", "patch"),
    # a resize through a claim template: a new template, the old one once unused
    ("resource.k8s.io", "resourceclaimtemplates", "create"),
    ("resource.k8s.io", "resourceclaimtemplates", "delete"),
}
# the steering component's (run --steer): its own webhook configuration and the webhook's
# certificate Secret (which the install makes empty), each by name
# (deploy/components/steering)
STEERING_API_USE = {
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "get"),
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "update"),
    ("", "secrets", "get"),
    ("", "secrets", "update"),
}
# the MIG manager mode's relabel (policy.mig_layout.mode relabel): its nodes' cordon,
# label and annotation, and the MIG manager's ConfigMap by name
# (deploy/components/mig-layout)
MIG_LAYOUT_API_USE = {
    ("", "nodes", "patch"),
    ("", "configmaps", "get"),
}
API_USE = DRY_RUN_API_USE | ENFORCE_API_USE


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.requests = 0

    async def get(self, path: str, **query: str) -> Answer:
        return await self.call("GET", path, query=query)

    async def list_metadata(self, path: str, **query: str) -> Answer:
        """A list of objects' metadata alone (PartialObjectMetadataList): labels and
        annotations for a fraction of the bytes."""
        return await self.call("GET", path, query=query, accept=METADATA_LIST)

    async def call(
        self,
        method: str,
        path: str,
        query: dict | None = None,
        body: dict | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Answer:
        """One request; a status the server gives is returned, never raised. Transport
        failures (refused, timeouts) raise as the client raises them."""
        self.requests += 1
        headers = {"Content-Type": content_type, "Accept": accept}
        _, url, headers, body_out, _ = await self.api.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        answer = await self.api.call_api(
            method,
            url,
            header_params=headers,
            body=body_out,
            _request_timeout=REQUEST_TIMEOUT_SECONDS,
        )
        response = answer.response
        try:
            text = await response.text()
        finally:
            response.release()
        try:
            parsed = json.loads(text) if text else {}
        except ValueError:
            parsed = {"message": text[:200]}
        return Answer(response.status, parsed if isinstance(parsed, dict) else {})

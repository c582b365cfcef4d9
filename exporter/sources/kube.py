"""Pod metadata source: watches this node's pods on the API server (kubernetes.aio) and
keeps pod UID -> namespace, name and container names for the snapshot to join."""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Mapping

import aiohttp
from kubernetes.aio import client, config, watch

from exporter.model import PodMeta

log = logging.getLogger(__name__)

WATCH_SECONDS = 300  # the server ends each watch after this; we resume from its version
REQUEST_TIMEOUT_SECONDS = 30.0
# Every (API group, resource, verb) the exporter uses; deploy/ grants exactly these.
API_USE = {("", "pods", "list"), ("", "pods", "watch")}
_QUERY_NAMES = {
    "watch": "watch",
    "resource_version": "resourceVersion",
    "timeout_seconds": "timeoutSeconds",
    "allow_watch_bookmarks": "allowWatchBookmarks",
}


def in_cluster() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ


class KubeconfigError(Exception):
    """The kubeconfig or in-cluster credentials cannot be used."""


def find_kubeconfig(given: str | None) -> str | None:
    """The kubeconfig kubectl would use: the one given, else $KUBECONFIG (its first
    file), else ~/.kube/config if it exists; None: try the in-cluster account."""
    if given:
        return given
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return listed[0]
    home = os.path.expanduser("~/.kube/config")
    return home if os.path.isfile(home) else None


async def api_client(kubeconfig: str | None) -> client.ApiClient | None:
    """An API client from the kubeconfig kubectl would use, or the in-cluster service
    account, or None."""
    kubeconfig = find_kubeconfig(kubeconfig)
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


def pod_meta(pod: dict) -> tuple[str, PodMeta]:
    """A pod object -> (uid, PodMeta) with container id (without runtime prefix) -> name."""
    containers: dict[str, str] = {}
    status = pod.get("status") or {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for s in status.get(key) or ():
            if s.get("containerID"):
                containers[s["containerID"].rpartition("://")[2]] = s["name"]
    meta = pod["metadata"]
    return meta["uid"], PodMeta(meta["namespace"], meta["name"], containers)


class PodMetadataWatch:
    """List, then watch, pods with ``spec.nodeName=<node>``; resync on any failure."""

    def __init__(self, api: client.ApiClient, node_name: str) -> None:
        self.api = api
        self.selector = f"spec.nodeName={node_name}"
        self._pods: dict[str, PodMeta] | None = None

    def current(self) -> Mapping[str, PodMeta] | None:
        """The pods as last seen; None until the first listing succeeded."""
        return self._pods

    async def run(self) -> None:
        backoff = 1.0
        while True:
            try:
                version = await self._list()
                backoff = 1.0
                await self._watch(version)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                # Names stay as last seen while we resync; they only fill labels.
                log.warning(
                    "pod metadata watch failed; retrying in %.0fs: %s",
                    backoff,
                    err,
                    extra={"reason": type(err).__name__},
                )
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, 60.0)

    async def get_pods(self, **query) -> aiohttp.ClientResponse:
        """GET this node's pods, with the client's own credentials and TLS.

        The generated CoreV1Api and its models cost ~25 MiB of RSS to build for this
        one call, so the request is made at the client's lower level and the answer
        read as plain JSON. Keyword names are those of the generated API (the watch
        helper passes them).
        """
        query.pop("_preload_content", None)
        params = [("fieldSelector", self.selector)]
        params += [(_QUERY_NAMES[k], v) for k, v in query.items()]
        timeout = query.get("timeout_seconds", 0) + REQUEST_TIMEOUT_SECONDS
        method, url, headers, _, _ = await self.api.param_serialize(
            "GET", "/api/v1/pods", query_params=params, auth_settings=["BearerToken"]
        )
        answer = await self.api.call_api(
            method, url, header_params=headers, _request_timeout=timeout
        )
        return answer.response

    async def _list(self) -> str:
        response = await self.get_pods()
        try:
            if response.status != 200:
                raise RuntimeError(f"listing pods: HTTP {response.status}")
            listing = await response.json()
        finally:
            response.release()
        self._pods = dict(pod_meta(p) for p in listing["items"])
        return listing["metadata"]["resourceVersion"]

    async def _watch(self, version: str) -> None:
        """Follow changes until the watch breaks (the caller then relists)."""
        while True:
            w = watch.Watch(return_type="object")  # events carry plain dicts
            stream = w.stream(
                self.get_pods,
                resource_version=version,
                timeout_seconds=WATCH_SECONDS,
                allow_watch_bookmarks=True,
            )
            async with stream:
                async for event in stream:
                    if event["type"] == "BOOKMARK":
                        continue
                    uid, meta = pod_meta(event["object"])
                    pods = dict(self._pods or {})
                    if event["type"] == "DELETED":
                        pods.pop(uid, None)
                    else:
                        pods[uid] = meta
                    self._pods = pods
            version = w.resource_version or version

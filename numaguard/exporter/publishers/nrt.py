"""Publishing this node's NodeResourceTopology (``--nrt``): written after a cycle when
it differs from what was last written — created, or replaced at the resourceVersion
read, so that a concurrent writer's change is never overwritten blind. A failed write is
logged and tried again the next cycle; it never holds the cycle up.

The kubelet's resource managers' policies come from its configuration file on the host
(``--kubelet-config``), as the cycle's kubelet source read it (again whenever it
changes): a kubelet restarted with another policy is published with it.
"""

from __future__ import annotations

import logging

import aiohttp

from numaguard.common.apiserver import ApiServer
from numaguard.exporter.model import NodeSnapshot
from numaguard.exporter.publishers.nrt_object import PATH, node_resource_topology

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 10.0
# What --nrt needs of the API server, beyond the pod watch (deploy/components/nrt grants it)
API_USE = {
    ("topology.node.k8s.io", "noderesourcetopologies", "get"),
    ("topology.node.k8s.io", "noderesourcetopologies", "create"),
    ("topology.node.k8s.io", "noderesourcetopologies", "update"),
}


class NrtPublisher:
    def __init__(self, api: ApiServer) -> None:
        self.api = api
        self.published: dict | None = None  # the object as last written
        self.current: bool | None = None  # None until the first cycle's object is known
        # what was last logged of writing: said once, not every cycle
        self._said = {"write": ""}

    async def publish(self, snap: NodeSnapshot) -> bool:
        """Write the object if it changed; True when what is published is current."""
        self.current = await self._publish(snap)
        return self.current

    async def _publish(self, snap: NodeSnapshot) -> bool:
        obj = node_resource_topology(snap)
        if obj is None or obj == self.published:
            return obj is not None
        path = f"{PATH}/{snap.node_name}"
        try:
            async with self.api.request("GET", path, REQUEST_TIMEOUT_SECONDS) as r:
                current = await r.json() if r.status == 200 else None
                if r.status not in (200, 404):
                    return self._failed(f"GET {path}: HTTP {r.status}")
            if current is None:
                method, where, body = "POST", PATH, obj
            else:  # what others put on it (labels, annotations, owners) stays
                meta = current["metadata"]
                kept = {
                    k: meta[k] for k in ("labels", "annotations", "ownerReferences") if k in meta
                }
                version = meta["resourceVersion"]
                body = {**obj, "metadata": {**kept, **obj["metadata"], "resourceVersion": version}}
                method, where = "PUT", path
            async with self.api.request(method, where, REQUEST_TIMEOUT_SECONDS, json=body) as r:
                if r.status not in (200, 201):  # 409: changed since the GET; next cycle
                    return self._failed(f"{method} {where}: HTTP {r.status}")
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError) as err:
            return self._failed(f"{path}: {err!r}")
        self.published, self._said["write"] = obj, ""
        return True

    def _failed(self, why: str) -> bool:
        self._say("write", f"not published: {why}")
        return False

    def _say(self, about: str, what: str) -> None:
        if what != self._said[about]:
            self._said[about] = what
            log.warning("NodeResourceTopology %s", what, extra={"detail": what})

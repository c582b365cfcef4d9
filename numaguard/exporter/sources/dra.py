"""DRA source: which GPU or MIG slice each Dynamic Resource Allocation device of this node
is, and which devices this node's pods' ResourceClaims were given.

ResourceSlices are watched for ``spec.nodeName=<node>`` (``resource.k8s.io/v1``, else
``v1beta2`` or ``v1beta1`` on older API servers). A claim is fetched by name when one of
the node's pods names it and until it is allocated: claims are not node-scoped, and
watching every claim of the cluster from every node would not scale. The kubelet's
PodResources API names claimed devices too (when its DRA support is on); this covers
kubelets that do not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from numaguard.common.apiserver import ApiServer
from numaguard.exporter.readers import ParseError
from numaguard.exporter.readers.dra import (
    Allocated,
    DraView,
    PublishedSlice,
    dra_view,
    read_claim_allocation,
    read_resource_slice,
)
from numaguard.exporter.records import PodMeta
from numaguard.exporter.sources.kube import REQUEST_TIMEOUT_SECONDS, ListWatch

log = logging.getLogger(__name__)

VERSIONS = ("v1", "v1beta2", "v1beta1")
CLAIMS_EVERY_SECONDS = 5.0  # how often the pods' claims not yet known are fetched


def _slice(obj: dict) -> tuple[str, PublishedSlice]:
    return obj["metadata"]["name"], read_resource_slice(obj)


class DraWatch:
    def __init__(
        self,
        api: ApiServer,
        node_name: str,
        pods: Callable[[], Mapping[str, PodMeta] | None],
    ) -> None:
        self.api = api
        self.pods = pods
        self.slices = ListWatch(
            api,
            tuple(f"/apis/resource.k8s.io/{v}/resourceslices" for v in VERSIONS),
            f"spec.nodeName={node_name}",
            _slice,
            "ResourceSlices",
        )
        self._claims: dict[tuple[str, str], tuple[Allocated, ...]] = {}
        self._read: set[tuple[str, str]] = set()  # claims read (allocated or not)

    def current(self) -> DraView | None:
        """None until the node's ResourceSlices were listed. The claims the node's pods
        name now and that were not read yet are counted unknown (all of them while the
        pods are not known), never as holding nothing."""
        slices = self.slices.current()
        if slices is None:
            return None
        wanted = self._wanted()
        if wanted is None:
            return dra_view(slices.values(), {}, 1)
        claims = {k: v for k, v in self._claims.items() if k in wanted}
        return dra_view(slices.values(), claims, len(wanted - self._read))

    def _wanted(self) -> set[tuple[str, str]] | None:
        pods = self.pods()
        if pods is None:
            return None
        return {(meta.namespace, claim) for meta in pods.values() for claim in meta.claims}

    async def run(self) -> None:
        await asyncio.gather(self.slices.run(), self._follow_claims())

    async def _follow_claims(self) -> None:
        while True:
            try:
                await self.fetch_claims()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the claims known stay; asked again next time
                log.warning("fetching ResourceClaims failed: %s", err)
            await asyncio.sleep(CLAIMS_EVERY_SECONDS)

    async def fetch_claims(self) -> None:
        """Fetch the claims the node's pods name that are not known allocated yet, and
        forget those no pod names any more."""
        wanted = self._wanted()
        if wanted is None or self.slices.current() is None:
            return  # nothing to ask for, or the version the server serves not known yet
        self._claims = {k: v for k, v in self._claims.items() if k in wanted}
        self._read &= wanted
        version = self.slices.path.split("/")[3]  # the version the server serves
        for namespace, name in sorted(wanted - set(self._claims)):
            path = f"/apis/resource.k8s.io/{version}/namespaces/{namespace}/resourceclaims/{name}"
            async with self.api.request("GET", path, REQUEST_TIMEOUT_SECONDS) as r:
                if r.status == 404:
                    self._read.add((namespace, name))  # gone: it holds no device
                    continue
                if r.status != 200:
                    raise RuntimeError(f"GET ResourceClaim {namespace}/{name}: HTTP {r.status}")
                obj = await r.json()
            try:
                allocated = read_claim_allocation(obj)
            except ParseError as err:
                log.warning("ResourceClaim %s/%s: %s", namespace, name, err)
                continue  # what it holds stays unknown
            self._read.add((namespace, name))
            if allocated is not None:  # allocations do not change once made
                self._claims[(namespace, name)] = allocated

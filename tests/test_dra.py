"""DRA on the real control plane: a MIG slice that the real scheduler allocates to a
pod's ResourceClaim, from the ResourceSlice NVIDIA's driver would publish for the node,
is attributed to that pod by the exporter (as its ServiceAccount, with deploy/'s RBAC),
with the NUMA verdict its placement earns; the kubelet here reports no claims, as one
without PodResources' DRA support."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest

from numaguard.common.apiserver import connect
from numaguard.exporter.records import PodMeta
from numaguard.exporter.sources.dra import DraWatch
from numaguard.simulator.cluster.simulated import one_node
from numaguard.simulator.fakes import dra, presets
from numaguard.simulator.parts.controlplane import ApiError
from numaguard.simulator.parts.processes import until
from tests.conftest import samples

pytestmark = pytest.mark.cluster

NODE = "dra-node"


async def scrape_until(url: str, check, timeout: float = 90.0):
    """(the exposition, what ``check`` found in it) once it finds something."""
    async with aiohttp.ClientSession() as session:

        async def scraped():
            async with session.get(f"{url}/metrics") as r:
                got = samples(await r.read())
            found = check(got)
            return (got, found) if found else None

        return await until(scraped, "said by the exporter", timeout)


def claim(profile: str) -> dict:
    selector = f'device.attributes["{dra.DRIVER}"].profile == "{profile}"'
    request = {"deviceClassName": dra.DRIVER, "selectors": [{"cel": {"expression": selector}}]}
    return {
        "apiVersion": dra.API,
        "kind": "ResourceClaim",
        "metadata": {"name": "mig-claim", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": request}]}},
    }


def dra_job() -> dict:
    both = {"cpu": "2", "memory": "1Gi"}  # Guaranteed: CPUs of its own
    container = {
        "name": "main",
        "image": "registry.example/main:1.0",
        "resources": {"requests": both, "limits": both, "claims": [{"name": "gpu"}]},
    }
    template = {
        "metadata": {"labels": {"app": "dra-job"}},
        "spec": {
            "containers": [container],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "mig-claim"}],
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "automountServiceAccountToken": False,
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "dra-job", "namespace": "ml"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "dra-job"}},
            "template": template,
        },
    }


def holder(got) -> dict | None:
    """The labels of the dra-job pod's holder series."""
    return next(
        (
            dict(k[1])
            for k in got
            if k[0] == "numaguard_gpu_holder_info" and dict(k[1])["pod"].startswith("dra-job")
        ),
        None,
    )


def device_remote(got) -> list[float]:
    return [
        v
        for k, v in got.items()
        if k[0] == "numaguard_pod_cross_numa"
        and dict(k[1])["pod"].startswith("dra-job")
        and dict(k[1])["reason"] == "device_remote"
    ]


async def test_a_mig_slice_claimed_through_dra_is_its_pods(control_plane):
    cp = control_plane
    host, nvml = presets.gpu_node()
    host.pods = []
    gpu = nvml.gpus[5]  # on NUMA node 1, with slices 4g.40gb and 3g.40gb
    wanted = next(s for s in gpu.mig if s.profile.name == "3g.40gb")
    async with one_node(cp, host, nvml, NODE, policy="none") as (sim, url):
        s = sim.session
        with contextlib.suppress(ApiError):  # another cluster of this session made it
            await cp.create(s, dra.device_class())
        published = [dra.resource_slice(NODE, nvml, [5])]
        try:
            for obj in published:
                await cp.create(s, obj)
            await sim.ensure_namespace("ml")
            await cp.create(s, claim("3g.40gb"))
            await cp.create(s, dra_job())
            # the real scheduler allocates the claim from the node's slice and binds the
            # pod; the exporter finds the device through the claim and the slice
            got, labels = await scrape_until(url, holder)
            assert (labels["gpu_uuid"], labels["mig_uuid"]) == (gpu.uuid, wanted.uuid)
            assert (labels["resource"], labels["source"], labels["numa_node"]) == (
                dra.DRIVER,
                "claim",
                "1",
            )
            allocated = await cp.get(s, "ResourceClaim", "ml", "mig-claim")
            (result,) = allocated["status"]["allocation"]["devices"]["results"]
            assert result["device"] == dra.device_name(5, wanted)
            # the node's policy (none) gave its CPUs on node 0: the slice is remote
            (job,) = sim.running("dra-job")
            assert job.containers[0].cpus == "0-1"
            got, _ = await scrape_until(url, device_remote)
            assert device_remote(got) == [1]
            # the node's zone 1 has the driver's two slices of GPU 5, one of them taken
            zone = {"node": NODE, "numa_node": "1", "resource": dra.DRIVER}
            for name, value in (("allocatable", 2), ("free", 1)):
                key = (f"numaguard_zone_devices_{name}", frozenset(zone.items()))
                assert got[key] == value, name
        finally:
            for obj in published:
                kind, name = obj["kind"], obj["metadata"]["name"]
                await cp.request(s, "DELETE", f"/apis/{dra.API}/{kind.lower()}s/{name}")


async def test_an_older_api_server_is_read_in_the_version_it_serves(control_plane, tmp_path):
    """An API server without resource.k8s.io/v1 (nor v1beta2), as the fault proxy plays
    one: the exporter's watch lists v1beta1, whose devices keep their attributes under
    ``basic``, and fetches the pods' claims there too."""
    cp = control_plane
    _, nvml = presets.gpu_node()
    async with contextlib.AsyncExitStack() as stack:
        session = await stack.enter_async_context(aiohttp.ClientSession())
        proxy = await stack.enter_async_context(cp.fault_proxy())
        newer = ("/apis/resource.k8s.io/v1/", "/apis/resource.k8s.io/v1beta2/")
        proxy.fail_next(404, 1_000_000, lambda method, path: path.startswith(newer))
        account = "numaguard-exporter"
        kubeconfig = cp.kubeconfig(
            tmp_path / "kubeconfig", cp.tokens[account], account, server=proxy.url
        )
        api = connect(kubeconfig)
        stack.push_async_callback(api.close)
        published = dra.resource_slice("old-node", nvml, [5])
        await cp.create(session, published)
        stack.push_async_callback(
            cp.request,
            session,
            "DELETE",
            f"/apis/{dra.API}/resourceslices/{published['metadata']['name']}",
        )
        pods = {"uid-1": PodMeta("default", "job", {}, {"job-claim": ("main",)})}
        watch = DraWatch(api, "old-node", lambda: pods)
        task = asyncio.create_task(watch.run())
        stack.callback(task.cancel)

        async def listed():
            return watch.current()

        view = await until(listed, "the node's ResourceSlices listed", 30)
        assert watch.slices.path == "/apis/resource.k8s.io/v1beta1/resourceslices"
        assert {d.uuid for d in view.devices.values()} == {s.uuid for s in nvml.gpus[5].mig}
        # the claim is asked for in the version the server serves (not there: nothing)
        await watch.fetch_claims()
        claims = [e.path for e in proxy.log if "resourceclaims" in e.path]
        assert claims and all("/v1beta1/namespaces/default/" in p for p in claims)
        assert watch.current().allocations == {}

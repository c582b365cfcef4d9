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


def mig_claim(name: str, profile: str, device_class: str = dra.MIG_CLASS) -> dict:
    return {
        "apiVersion": dra.API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": dra.mig_claim_spec(profile, device_class),
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


def holder(got, pod: str = "dra-job") -> dict | None:
    """The labels of the pod's holder series (its name starts with ``pod``), once found
    through its claim (its process on the slice may name it first: claims are fetched
    every few seconds)."""
    return next(
        (
            dict(k[1])
            for k in got
            if k[0] == "numaguard_gpu_holder_info"
            and dict(k[1])["pod"].startswith(pod)
            and dict(k[1])["source"] == "claim"
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
            await cp.create(s, mig_claim("mig-claim", "3g.40gb", dra.DRIVER))
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
        task = asyncio.create_task(watch.slices.run())  # claims fetched below, by hand
        stack.callback(task.cancel)

        async def listed():
            return watch.current()

        view = await until(listed, "the node's ResourceSlices listed", 30)
        assert view.claims_unknown == 1  # job-claim not read yet: its devices unknown
        assert watch.slices.path == "/apis/resource.k8s.io/v1beta1/resourceslices"
        assert {d.uuid for d in view.devices.values()} == {s.uuid for s in nvml.gpus[5].mig}
        # the claim is asked for in the version the server serves (not there: nothing)
        await watch.fetch_claims()
        claims = [e.path for e in proxy.log if "resourceclaims" in e.path]
        assert claims and all("/v1beta1/namespaces/default/" in p for p in claims)
        assert watch.current().allocations == {}
        assert watch.current().claims_unknown == 0  # read: none, it holds nothing


def mig_pod(name: str, claim_name: str) -> dict:
    container = {
        "name": "main",
        "image": "registry.example/main:1.0",
        "resources": {"claims": [{"name": "gpu"}]},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "containers": [container],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "nodeSelector": {"kubernetes.io/hostname": DYNAMIC_NODE},
            "automountServiceAccountToken": False,
        },
    }


DYNAMIC_NODE = "dynamic-mig-node"


async def test_the_exporter_says_what_mig_slices_the_scheduler_will_still_allocate(
    control_plane,
):
    """GPU 7 under NVIDIA's DynamicMIG (v25.12, its counters in a slice of their own): pods
    ask for MIG profiles one after another; before each, the exporter's free count for
    the profile says whether the real scheduler will allocate it from the counters, and
    it says 0 before the scheduler first refuses. Each slice allocated is made on the
    node as the driver prepares the claim, and the cross-check finds nothing amiss."""
    cp = control_plane
    host, nvml = presets.gpu_node()
    host.pods = []
    nvml.set_mig(7, [])  # MIG on, nothing made: DynamicMIG makes slices as claims come
    nvml.gpus[7].dynamic_mig = True  # published so by the simulated cluster
    gpu = nvml.gpus[7]
    ids = {"node": DYNAMIC_NODE, "driver": dra.DRIVER, "counter_set": "gpu-7-counter-set"}
    ids["gpu_uuid"] = gpu.uuid

    def key(name: str, **labels: str):
        return name, frozenset((ids | labels).items())

    async with one_node(cp, host, nvml, DYNAMIC_NODE, policy="none") as (sim, url):
        s = sim.session
        await sim.ensure_namespace("ml")
        sms = 0  # what the claims allocated so far take
        refused = None
        asked = ["2g.20gb", "3g.40gb", *["1g.10gb"] * 6]
        for step, profile in enumerate(asked):

            def said(got, profile=profile, sms=sms):
                consumed = key("numaguard_dra_counter", counter="multiprocessors", state="consumed")
                amiss = key(
                    "numaguard_dra_counter_mismatch_slices", kind="claimed_without_instance"
                )
                free = key("numaguard_gpu_mig_profiles_free", mig_profile=profile)
                caught_up = got.get(consumed) == sms and got.get(amiss) == 0
                return (got[free],) if caught_up and free in got else None  # 0 is news

            _, (free,) = await scrape_until(url, said)
            name = f"mig-{step}"
            await cp.create(s, mig_claim(name, profile))
            await cp.create(s, mig_pod(name, name))

            async def decided(name=name):
                pod = await cp.get(s, "Pod", "ml", name)
                conditions = {c["type"]: c for c in pod["status"].get("conditions", [])}
                scheduled = conditions.get("PodScheduled", {})
                if (
                    scheduled.get("status") == "False"
                    and scheduled.get("reason") == "Unschedulable"
                ):
                    return "refused"
                return "running" if sim.running(name) else None

            outcome = await until(decided, f"the scheduler decided on {name}", 120)
            assert outcome == ("running" if free else "refused"), (profile, free)
            if outcome == "refused":
                claim = await cp.get(s, "ResourceClaim", "ml", name)
                assert not claim.get("status", {}).get("allocation")
                refused = profile
                break
            sms += gpu.model.profile(profile).sm_count
        assert refused == "1g.10gb", "the scheduler never refused: the GPU was not filled"
        # what the scheduler placed is what NVML now has, slice for slice
        made = sorted((sl.profile.name, sl.placement_start) for sl in gpu.mig)
        allocated = []
        for step in range(len(made)):
            claim = await cp.get(s, "ResourceClaim", "ml", f"mig-{step}")
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            allocated.append(result["device"])
        assert sorted(allocated) == sorted(
            dra.mig_name(7, gpu.model.profile(p), st) for p, st in made
        )


async def test_an_extended_resource_a_device_class_maps_gets_a_claim_and_its_slice(
    control_plane,
):
    """A pod asks for nvidia.com/mig-1g.20gb, which no device plugin on the node offers
    and a DeviceClass maps (extendedResourceName, GA in 1.37): the real scheduler makes
    and allocates its claim from GPU 7's counters, the slice is made, and the exporter
    attributes it to the pod through that claim."""
    cp = control_plane
    host, nvml = presets.gpu_node()
    host.pods = []
    nvml.set_mig(7, [])
    nvml.gpus[7].dynamic_mig = True
    name = "extended-node"
    mapped = dra.device_class("mig-1g.20gb", "mig", extended_resource="nvidia.com/mig-1g.20gb")
    mapped["spec"]["selectors"].append(dra.profile_selector("1g.20gb"))
    async with one_node(cp, host, nvml, name, policy="none") as (sim, url):
        s = sim.session
        with contextlib.suppress(ApiError):
            await cp.create(s, mapped)
        try:
            await sim.ensure_namespace("ml")
            pod = mig_pod("extended", "unused")
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": name}
            del pod["spec"]["resourceClaims"]
            pod["spec"]["containers"][0]["resources"] = {
                "limits": {"nvidia.com/mig-1g.20gb": "1", "cpu": "1", "memory": "1Gi"}
            }
            await cp.create(s, pod)

            _, labels = await scrape_until(url, lambda got: holder(got, "extended"), 120)
            (made,) = [sl for sl in nvml.gpus[7].mig if sl.profile.name == "1g.20gb"]
            assert (labels["gpu_uuid"], labels["mig_uuid"]) == (nvml.gpus[7].uuid, made.uuid)
            status = (await cp.get(s, "Pod", "ml", "extended"))["status"]
            claim = status["extendedResourceClaimStatus"]["resourceClaimName"]
            allocated = await cp.get(s, "ResourceClaim", "ml", claim)
            (result,) = allocated["status"]["allocation"]["devices"]["results"]
            assert result["device"] == dra.mig_name(7, made.profile, made.placement_start)
        finally:
            await cp.request(s, "DELETE", f"/apis/{dra.API}/deviceclasses/mig-1g.20gb")

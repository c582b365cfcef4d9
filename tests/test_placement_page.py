"""The node's placement map (/placement): what the page draws and the JSON says, against
the cycle's own snapshot of the reference GPU node and the demo node — every exclusive CPU
in its pod's colour, every GPU under its NUMA node, every pod with a verdict outlined and
named in words, nothing fetched, a bounded size — and how the exporter serves it."""

from __future__ import annotations

import json
import tempfile

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from numaguard.exporter.collection import Collection
from numaguard.exporter.model.placement_map import placement_map
from numaguard.exporter.placement_page import render
from numaguard.exporter.server import Exporter
from numaguard.exporter.settings import Settings
from numaguard.exporter.sources.host import HostSource
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import FakeHostRoot
from tests.conftest import NODE
from tests.helpers.browser import drawn_or_row, parsed, rendered, screenshot
from tests.helpers.gpu_node import gpu_collection

MAX_PAGE_BYTES = 256 * 1024  # the reference node's page: 8 NUMA nodes, 224 CPUs, 56 slices


def exclusive_holders(snap) -> dict[int, str]:
    """Each exclusive CPU of the snapshot -> the uid of the pod holding it."""
    return {
        cpu: pod.uid
        for pod in snap.pods
        for ctr in pod.containers
        if ctr.exclusive_cpus
        for cpu in ctr.cpus or ()
    }


def gpus_under_numa_nodes(found) -> dict[int, list[int]]:
    """Each drawn GPU -> the NUMA nodes whose groups it is drawn inside."""
    return {
        int(a["data-gpu"]): [int(g["data-numa-node"]) for g in around if "data-numa-node" in g]
        for _, a, around in found
        if "data-gpu" in a
    }


async def snapshot_of(preset):
    now = [0.0]
    host, nvml = preset(lambda: now[0])

    root = FakeHostRoot(tempfile.mkdtemp(dir="/tmp"), host).write()
    async with gpu_collection(host, nvml, root, lambda: now[0]) as (collection, gpus):
        gpus.start()
        await collection.run_once()
        now[0] += 15  # GPM's activity is measured between two cycles
        await collection.run_once()
        return collection.snapshot, collection


async def test_the_reference_node_s_map_shows_who_holds_what_where():
    snap, _ = await snapshot_of(presets.reference_gpu_node)
    data = placement_map(snap)
    page = render(data)
    assert len(page.encode()) < MAX_PAGE_BYTES
    found = parsed(page).found
    # every exclusive CPU in its pod's colour, and no other CPU
    holders = exclusive_holders(snap)
    cpus = {int(a["data-cpu"]): a.get("data-pod") for tag, a, _ in found if "data-cpu" in a}
    assert set(cpus) == set(range(224))
    assert {c: p for c, p in cpus.items() if p} == holders and len(holders) == 112
    # every GPU inside its NUMA node's group, the one NVML says it hangs off
    assert gpus_under_numa_nodes(found) == {g.index: [g.numa_node] for g in snap.gpus.gpus}
    # each slice held in its holder's colour
    held = {(u.mig or u.gpu).uuid: u.pod_uid for u in snap.device_uses}
    drawn = {a["data-device"]: a.get("data-pod") for _, a, _ in found if "data-device" in a}
    assert {d: p for d, p in drawn.items() if p} == held
    # every pod with a verdict named with it in words, and outlined where it is drawn
    judged = {uid: pod for uid, pod in data["pods"].items() if pod["verdicts"]}
    assert judged, "the reference node has pods with verdicts"
    rows = {a["data-pod"]: a["title"] for tag, a, _ in found if tag == "tr" and "data-pod" in a}
    for uid, pod in judged.items():
        for verdict in pod["verdicts"]:
            assert verdict["words"] in rows[uid], (uid, verdict)
        marks = [a for t, a, _ in found if a.get("data-pod") == uid and drawn_or_row(t, a)]
        assert marks and all("data-verdict" in a for a in marks), uid
    # one line from each pod to each device it holds
    lines = {(a["data-pod"], a["data-to"]) for tag, a, _ in found if tag == "line"}
    assert {(p, d) for d, p in held.items() if p in {h for h in holders.values()}} <= lines
    # nothing fetched: no script, no stylesheet or font from elsewhere, no URL but the SVG
    # namespace's
    assert not [t for t, _, _ in found if t in ("script", "img", "iframe", "object")]
    assert [a["href"] for t, a, _ in found if t == "link"] == ["data:,"]  # its icon, inline
    assert "url(" not in page and "@import" not in page
    assert page.count("http") == page.count("http://www.w3.org/2000/svg")


async def test_the_json_says_what_the_page_draws():
    snap, _ = await snapshot_of(presets.gpu_node)
    data = placement_map(snap)
    assert json.loads(json.dumps(data)) == data
    (trainer,) = [p for p in data["pods"].values() if p["name"] == "trainer"]
    assert trainer["exclusive_cpus"] == list(range(8))
    assert trainer["cpus_by_numa_node"] == {"0": 8}
    remote = next(p for p in data["pods"].values() if p["name"] == "trainer-remote")
    assert {v["reason"] for v in remote["verdicts"]} >= {"device_remote"}
    # its GPU is under NUMA node 1, its CPUs on node 0
    (gpu4,) = [
        g for n in data["numa_nodes"] if n["numa_node"] == 1 for g in n["gpus"] if g["index"] == 4
    ]
    uid = next(u for u, p in data["pods"].items() if p["name"] == "trainer-remote")
    assert gpu4["holder"] == uid
    # a notebook in the shared pool: listed for its slice, no CPU of its own
    notebook = next(p for p in data["pods"].values() if p["name"] == "notebook-0")
    assert notebook["exclusive_cpus"] == [] and notebook["devices"]


async def test_the_exporter_serves_it_once_a_cycle_and_only_when_asked():
    snap, collection = await snapshot_of(presets.gpu_node)
    exporter = Exporter(Settings(), collection)
    async with TestClient(TestServer(exporter.app)) as client:
        assert exporter._placement is None  # a cycle draws nothing
        page = await client.get("/placement")
        assert page.status == 200 and page.content_type == "text/html"
        assert "default-src 'none'" in page.headers["Content-Security-Policy"]
        body = await page.text()
        assert "Placement on" in body
        drawn = exporter._placement
        again = await client.get("/placement?format=json")
        assert again.content_type == "application/json"
        assert json.loads(await again.read()) == json.loads(json.dumps(placement_map(snap)))
        assert exporter._placement is drawn  # the same cycle's, not drawn again
        assert (await client.get("/placement?format=xml")).status == 400
        index = await (await client.get("/")).text()
        assert "href='/placement'" in index and "href='/metrics'" in index


async def test_pods_not_read_leave_every_holder_unknown_not_a_shared_pool(fake_root):
    """The pods' cgroups unreadable this cycle: the page says no holder is known and draws
    no CPU in the pool's grey; the JSON says pods_known false; the rest is drawn."""
    root = fake_root(presets.two_socket())

    class Unreadable:
        def read(self, *_):
            raise OSError("cgroups unreadable")

    collection = Collection(
        NODE, {"host_numa": HostSource(str(root.root)), "pod_placement": Unreadable()}
    )
    await collection.run_once()
    exporter = Exporter(Settings(), collection)
    async with TestClient(TestServer(exporter.app)) as client:
        page = await (await client.get("/placement")).text()
        data = json.loads(await (await client.get("/placement?format=json")).read())
    assert data["pods_known"] is False and data["pods"] == {}
    found = parsed(page).found
    assert [a for _, a, _ in found if a.get("data-pods-unknown") == "true"]
    cpus = [a for _, a, _ in found if "data-cpu" in a]
    assert len(cpus) == 32 and all(a["fill"] == "#fff" for a in cpus)
    assert [n["numa_node"] for n in data["numa_nodes"]] == [0, 1]


@pytest.mark.browser
async def test_chromium_draws_the_reference_node_s_page_fetching_nothing():
    """The page as a person gets it: served by the exporter, rendered by Chromium, whose
    DOM holds every CPU in its pod's colour and every GPU under its NUMA node; the page
    asks for nothing (no request with its origin as initiator), where a page beside it
    that shows an image is seen asking for it."""
    snap, collection = await snapshot_of(presets.reference_gpu_node)
    exporter = Exporter(Settings(), collection)
    # a page that does fetch something, served beside it: the network log would see it
    control = (
        "<!doctype html><html><head><link rel='icon' href='data:,'></head>"
        "<body><img src='/pixel.png'></body></html>"
    )

    async def controlled(_):
        return web.Response(text=control, content_type="text/html")

    exporter.app.router.add_get("/control", controlled)
    async with TestClient(TestServer(exporter.app)) as client:
        _, fetched = await rendered(str(client.make_url("/control")))
        assert fetched == [str(client.make_url("/pixel.png"))]
        url = str(client.make_url("/placement"))
        dom, asked = await rendered(url)
        assert asked == []
        shot = await screenshot(url, "placement-reference-node")
    found = parsed(dom).found
    holders = exclusive_holders(snap)
    cpus = {int(a["data-cpu"]): a.get("data-pod") for _, a, _ in found if "data-cpu" in a}
    assert {c: p for c, p in cpus.items() if p} == holders and len(cpus) == 224
    assert gpus_under_numa_nodes(found) == {g.index: [g.numa_node] for g in snap.gpus.gpus}
    assert shot.stat().st_size > 10_000  # a drawing, not a blank page

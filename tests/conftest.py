"""Shared test helpers: run collection cycles over fake roots and read back the samples."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from numaguard.exporter.collection import Collection
from numaguard.exporter.model.thresholds import Thresholds
from numaguard.exporter.records import PodMeta
from numaguard.exporter.sources.cgroups import CgroupSource
from numaguard.exporter.sources.gpu import NvmlSource
from numaguard.exporter.sources.host import HostSource
from numaguard.exporter.sources.kubelet import PodResourcesSource
from numaguard.exporter.sources.resctrl import ResctrlSource
from numaguard.simulator.alertmanager import AlertmanagerServer
from numaguard.simulator.controlplane import ControlPlane
from numaguard.simulator.host import FakeHost, FakeHostRoot
from numaguard.simulator.host import pod_metadata as metadata_of  # noqa: F401 (for the tests)
from numaguard.simulator.prometheus import PrometheusServer
from numaguard.simulator.resctrl import FakeResctrl

NODE = "test-node"

Samples = dict[tuple[str, frozenset], float]


def samples(exposition: bytes) -> Samples:
    """Exposition text -> {(sample name, frozenset of labels): value}."""
    out: Samples = {}
    for family in text_string_to_metric_families(exposition.decode()):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def series(name: str, **labels: str) -> tuple[str, frozenset]:
    return name, frozenset({"node": NODE, **labels}.items())


def make_collection(
    root: FakeHostRoot,
    metadata: Mapping[str, PodMeta] | None = None,
    thresholds: Thresholds = Thresholds(),
    timeout: float = 10.0,
    resctrl: FakeResctrl | None = None,
    resctrl_mode: str = "auto",
    clock=None,
    gpus: NvmlSource | None = None,
    kubelet: PodResourcesSource | None = None,
) -> Collection:
    sources = {
        "host_numa": HostSource(str(root.root)),
        "pod_placement": CgroupSource(str(root.root), page_size=root.host.page_size),
    }
    if resctrl is not None:
        sources["resctrl"] = ResctrlSource(str(root.root), resctrl_mode, resctrl)
    if gpus is not None:
        sources["gpu"] = gpus
    if kubelet is not None:
        sources["pod_resources"] = kubelet
    return Collection(
        NODE,
        sources,
        metadata=lambda: metadata,
        thresholds=thresholds,
        timeout_seconds=timeout,
        **({"clock": clock} if clock else {}),
    )


# The tiers, by the real parts a test starts: `pure` (nothing but this process and its
# threads, sockets and children of our own), `prometheus` (a real Prometheus, promtool or
# Alertmanager), `cluster` (the real control plane), `vm` (a real node in a QEMU guest).
# A module names the tiers it needs with ``pytestmark``; a test that uses the control
# plane fixture is a cluster test by that alone; a test with no tier is pure, and a pure
# test that starts a real part fails, so a tier cannot be forgotten.
TIERS = ("pure", "prometheus", "cluster", "vm")


def pytest_collection_modifyitems(items):
    for item in items:
        if "control_plane" in item.fixturenames:
            item.add_marker(pytest.mark.cluster)
        if not any(item.get_closest_marker(t) for t in TIERS[1:]):
            item.add_marker(pytest.mark.pure)


@pytest.fixture(autouse=True)
def _pure_tests_start_no_real_part(request, monkeypatch):
    if request.node.get_closest_marker("pure") is None:
        return

    async def refused(self, *args, **kwargs):
        raise AssertionError(
            f"{request.node.nodeid} starts {type(self).__name__}: mark its module with the "
            "tier it needs (pytestmark = pytest.mark.prometheus or .cluster)"
        )

    monkeypatch.setattr(PrometheusServer, "start", refused)
    monkeypatch.setattr(ControlPlane, "start", refused)
    monkeypatch.setattr(AlertmanagerServer, "__aenter__", refused)


@pytest.fixture
def fake_root(tmp_path):
    """Build a fake host root from a FakeHost: ``fake_root(presets.two_socket())``."""

    def build(host: FakeHost) -> FakeHostRoot:
        return FakeHostRoot(tmp_path / "host", host).write()

    return build


@pytest.fixture(scope="session")
def control_plane():
    """The real control plane, once per session, with deploy/'s namespace and RBAC
    applied and a token for each of our ServiceAccounts. Each simulated cluster removes
    what it made when it stops."""
    cp = ControlPlane()

    async def start():
        await cp.start()
        async with aiohttp.ClientSession() as session:
            await cp.install_numaguard(session)

    try:
        asyncio.run(start())
        yield cp
    finally:
        cp.stop()

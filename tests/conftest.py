"""Shared test helpers: run collection cycles over fake roots and read back the samples."""

from __future__ import annotations

import asyncio
import math
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import pytest

from numaguard.exporter.collection import Collection
from numaguard.exporter.model.thresholds import Thresholds
from numaguard.exporter.records import PodMeta
from numaguard.exporter.sources.cgroups import CgroupSource
from numaguard.exporter.sources.gpu import NvmlSource
from numaguard.exporter.sources.host import HostSource
from numaguard.exporter.sources.kubelet import PodResourcesSource
from numaguard.exporter.sources.resctrl import ResctrlSource
from numaguard.simulator.fakes.host import FakeHost, FakeHostRoot
from numaguard.simulator.fakes.host import pod_metadata as metadata_of  # noqa: F401 (for the tests)
from numaguard.simulator.fakes.resctrl import FakeResctrl
from numaguard.simulator.parts.alertmanager import AlertmanagerServer
from numaguard.simulator.parts.controlplane import ControlPlane
from numaguard.simulator.parts.prometheus import PrometheusServer

NODE = "test-node"

# `make test-fast` (the developer's loop) runs each property test on a quarter of its
# examples; `make test`, and so CI, runs them all.
FAST = os.environ.get("NUMAGUARD_TESTS") == "fast"


def examples(n: int) -> int:
    """A property test's number of examples, for this run."""
    return max(10, n // 4) if FAST else n


Samples = dict[tuple[str, frozenset], float]


# One sample line as our exposition writes it: a name, its labels, one value.
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_VALUES = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}


def samples(exposition: bytes) -> Samples:
    """Exposition text -> {(sample name, frozenset of labels): value}.

    Strict, and fast: every line is a comment or a whole sample line, label values
    unescaped as the text format says; prometheus_client's parser (what test_exposition
    and test_catalogue hold our whole exposition to, and this agrees with there) costs a
    quarter of a second per GPU node exposition."""
    out: Samples = {}
    for line in exposition.decode().splitlines():
        if not line or line.startswith("# "):
            continue
        m = _SAMPLE.fullmatch(line)
        assert m, f"not a sample line: {line!r}"
        name, text, value = m.groups()
        labels, at = {}, 0
        while text and at < len(text):
            label = _LABEL.match(text, at)
            assert label, f"bad labels at {at}: {line!r}"
            key, raw = label[1], label[2]
            assert key not in labels, f"label {key} twice: {line!r}"
            labels[key] = re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e[0]], raw)
            at = label.end()
        key = (name, frozenset(labels.items()))
        assert key not in out, f"duplicate series {key}"
        out[key] = _VALUES[value] if value in _VALUES else float(value)
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
    detail: bool = True,  # the readers' tests look at every family; the default's own tests not
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
        detail=detail,
    )


# The tiers, by the real parts a test starts: `pure` (nothing but this process and its
# threads, sockets and children of our own), `prometheus` (a real Prometheus, promtool or
# Alertmanager), `cluster` (the real control plane), `vm` (a real node in a QEMU guest),
# `scale` (a node of thousands of pods: a minute of writing files and reading them),
# `browser` (Debian's headless Chromium, on the pages a person reads).
# A module names the tiers it needs with ``pytestmark``; a test that uses the control
# plane fixture is a cluster test by that alone; a test with no tier is pure, and a pure
# test that starts a real part fails, so a tier cannot be forgotten.
TIERS = ("pure", "prometheus", "cluster", "vm", "scale", "browser")


# The files of the vm tier. make test runs them one after another on one pytest-xdist
# worker, as an emulated guest keeps a core busy, and spreads the other files over the
# rest (a file's tests together: its module fixtures are made once). The scheduler sees
# test ids only, so the files are named here; collection checks them against the marker.
VM_FILES = frozenset(
    f"tests/{name}.py"
    for name in ("test_node_vm", "test_kubenode", "test_kubenode_loop", "test_kubelet_agreement")
)


def pytest_collection_modifyitems(items):
    for item in items:
        if "control_plane" in item.fixturenames:
            item.add_marker(pytest.mark.cluster)
        if not any(item.get_closest_marker(t) for t in TIERS[1:]):
            item.add_marker(pytest.mark.pure)
        in_vm_file = item.nodeid.split("::")[0] in VM_FILES
        if (item.get_closest_marker("vm") is not None) != in_vm_file:
            raise pytest.UsageError(f"{item.nodeid}: vm marker and VM_FILES disagree")
    # the vm tier is the longest unit: started first, it is not left running alone at
    # the end
    items.sort(key=lambda item: item.get_closest_marker("vm") is None)


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, the vm tier's files one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFileVmTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::")[0]
            return "vm" if file in VM_FILES else file

    return ByFileVmTogether(config, log)


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


# A fake host root is a thousand small files: on a tmpfs, where the machine has one,
# writing one costs a quarter of what it does on disk.
TMPFS = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@pytest.fixture
def fake_root(tmp_path):
    """Build a fake host root from a FakeHost: ``fake_root(presets.two_socket())``."""
    folder = Path(tempfile.mkdtemp(prefix="ng-root", dir=TMPFS)) if TMPFS else tmp_path

    def build(host: FakeHost) -> FakeHostRoot:
        return FakeHostRoot(folder / "host", host).write()

    yield build
    if TMPFS:
        shutil.rmtree(folder, ignore_errors=True)


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

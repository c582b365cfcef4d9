"""A fake GPU node's collection, as the GPU tests build it: its fake NVML installed, its
fake kubelet serving PodResources, and the exporter's GPU and kubelet sources on them;
all of it stopped afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import pynvml

from numaguard.exporter.sources.gpu import NvmlSource
from numaguard.exporter.sources.kubelet import PodResourcesSource
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import GIB, KUBELET_CONFIG, FakeContainer, FakeHost, FakePod
from numaguard.simulator.fakes.nvml import FakeNvml
from numaguard.simulator.fakes.podresources import FakeKubelet
from tests.conftest import make_collection, metadata_of


@contextlib.asynccontextmanager
async def gpu_collection(host, nvml, root, clock):
    """(the collection, its GPU source) over ``host`` and ``nvml``, written at ``root``."""
    socket = f"{tempfile.mkdtemp(dir='/tmp')}/kubelet.sock"  # short: a socket path's limit
    kubelet = FakeKubelet(socket, host, nvml)
    with nvml.installed():
        await kubelet.start()
        gpus = NvmlSource(pynvml, str(root.root), clock=clock)
        pod_resources = PodResourcesSource(socket, config=str(root.root / KUBELET_CONFIG))
        try:
            collection = make_collection(
                root, metadata=metadata_of(host), gpus=gpus, kubelet=pod_resources
            )
            yield collection, gpus
        finally:
            gpus.close()
            pod_resources.close()
            await kubelet.stop()
            shutil.rmtree(os.path.dirname(socket))


def holding(host: FakeHost, nvml: FakeNvml, pods: dict[str, list[int]]) -> None:
    """Pods of the device plugin, each holding the full GPUs listed."""
    for name, indices in pods.items():
        pod = FakePod(name, presets.pod_uid(name), "guaranteed", [], "ml")
        ctr = FakeContainer("main", "", {0: GIB})
        ctr.devices["nvidia.com/gpu"] = [nvml.gpus[i].uuid for i in indices]
        pod.containers.append(ctr)
        host.pods.append(pod)

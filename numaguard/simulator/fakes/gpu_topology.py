"""Well-known GPU machines, laid out once for both fakes: where each GPU sits on PCIe
(its host bridge, the switch above it and the one above that) and its NVLinks, in the
fake NVML; and the same tree as sysfs shows it, in the fake host (each GPU's
/sys/bus/pci/devices link resolving through its root complex and bridges). NVML's
levels come from the first, the exporter's sysfs levels from the second: a test that
sees them agree has checked two models against each other.

The layouts, as ``nvidia-smi topo -m`` prints them (tests/test_gpu_links.py):

* ``hgx``: 8 GPUs, 4 a socket, each behind a PCIe switch of its own, all on 4 NVSwitches
  with 18 links each: NV18 between every pair, across sockets too.
* ``bridged``: 4 PCIe cards, 2 a socket on their own root ports, each pair joined by an
  NVLink bridge of 12 links: NV12 within a pair, SYS across sockets (the shape of
  NVIDIA/k8s-device-plugin#546).
* ``pcie``: 8 PCIe cards and no NVLink: on socket 0 one root port with a switch of
  switches over two switches of two GPUs (PIX within a switch, PXB across), on socket 1
  two GPUs on a switch, one on its own root port of the same host bridge (PHB) and one
  on a second host bridge (NODE); SYS across sockets.
"""

from __future__ import annotations

from numaguard.exporter.readers.nvml import sysfs_pci_address
from numaguard.simulator.fakes.host import FakeHost
from numaguard.simulator.fakes.nvml import FakeNvml

NVSWITCHES = tuple(f"00000000:{0xA0 + i:02X}:00.0" for i in range(4))


def hgx(nvml: FakeNvml, host: FakeHost, model: str = "H100-80GB") -> None:
    for i in range(8):
        gpu = nvml.add_gpu(model, i // 4)
        gpu.pci_root = f"0000:{0x00 if i < 4 else 0x80:02x}"
        gpu.pci_switch = f"sw{i}"
        gpu.nvlinks = [NVSWITCHES[k % 4] for k in range(18)]
    lay_out(nvml, host)


def bridged(nvml: FakeNvml, host: FakeHost, model: str = "H100-80GB") -> None:
    for i in range(4):
        gpu = nvml.add_gpu(model, i // 2)
        gpu.pci_root = f"0000:{0x00 if i < 2 else 0x80:02x}"
    for a, b in ((0, 1), (2, 3)):
        nvml.gpus[a].nvlinks, nvml.gpus[b].nvlinks = [b] * 12, [a] * 12
    lay_out(nvml, host)


def pcie(nvml: FakeNvml, host: FakeHost, model: str = "H100-80GB") -> None:
    where = [  # (NUMA node, host bridge, switch, the switch above it)
        (0, "0000:00", "s0", "u0"),
        (0, "0000:00", "s0", "u0"),
        (0, "0000:00", "s1", "u0"),
        (0, "0000:00", "s1", "u0"),
        (1, "0000:80", "s2", ""),
        (1, "0000:80", "s2", ""),
        (1, "0000:80", "", ""),
        (1, "0000:c0", "", ""),
    ]
    for numa, root, switch, upstream in where:
        gpu = nvml.add_gpu(model, numa)
        gpu.pci_root, gpu.pci_switch, gpu.pci_upstream = root, switch, upstream
    lay_out(nvml, host)


def lay_out(nvml: FakeNvml, host: FakeHost) -> None:
    """The fake host's sysfs PCI tree for the fake NVML's GPUs: for each, the bridges
    from its root complex down (a root port; a switch's upstream port and the downstream
    port towards each child), each bridge named once however many GPUs sit below it."""
    bridges: dict[tuple, str] = {}

    def bridge(root: str, *key: str) -> str:
        if (root, *key) not in bridges:
            domain, bus = root.split(":")
            bridges[root, *key] = f"{domain}:{int(bus, 16) + 1 + len(bridges):02x}:00.0"
        return bridges[root, *key]

    for i, gpu in enumerate(nvml.gpus):
        root = gpu.host_bridge
        top = gpu.pci_upstream or gpu.pci_switch or f"gpu{i}"
        path = [bridge(root, "port", top)]
        if gpu.pci_upstream:
            u = gpu.pci_upstream
            path += [bridge(root, u, "up"), bridge(root, u, "down", gpu.pci_switch)]
        if gpu.pci_switch:
            s = gpu.pci_switch
            path += [bridge(root, s, "up"), bridge(root, s, "down", str(i))]
        address = sysfs_pci_address(gpu.pci_bus_id)
        host.pci_devices[address] = gpu.numa_node
        host.pci_paths[address] = (f"pci{root}", *path)

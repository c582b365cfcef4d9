"""The catalogue is the single source of metric names: everything exported is declared
there with its labels, names follow Prometheus conventions, and the doc is current."""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from numaguard.contract.catalogue import CATALOGUE
from numaguard.exporter import docs
from numaguard.exporter.mover.orders import MoveTotals
from numaguard.simulator.fakes import dra, gpu_topology, presets
from numaguard.simulator.fakes.host import MIB, FakeHost, FakeNumaNode
from numaguard.simulator.fakes.nvml import FakeNvml
from numaguard.simulator.fakes.resctrl import FakeResctrl
from tests.conftest import NODE, make_collection, metadata_of
from tests.helpers.gpu_node import gpu_collection, holding

ALLOWED_LABELS = {
    # docs/design.md, Metric contract
    "numa_node",
    "socket",
    "l3_domain",
    "gpu",
    "gpu_uuid",
    "mig_uuid",
    "gi_id",
    "ci_id",
    "mig_profile",
    "namespace",
    "pod",
    "container",
    "pod_uid",
    "container_id",
    "resource",
    # bounded enumerations and identifiers of our own
    "target_numa_node",
    "cpulist",
    "kind",
    "reason",
    "stall",
    "qos_class",
    "runtime",
    "exclusive_cpus",
    "collector",
    "version",
    "python_version",
    "driver_version",  # one value a node: its NVIDIA driver's
    "nvml_version",
    "mode",
    "state",
    "phase",
    "model",
    "pci_bus_id",
    "mig_mode",
    "placement_start",
    "placement_size",
    "direction",
    "source",
    "result",
    "guard",
    "outcome",
    "workload",  # the remediator's: kind/namespace/name of a workload it reports on
    "driver",  # a DRA driver's name
    "counter_set",  # DRA counter sets: at most 8 a ResourceSlice, one a GPU under DynamicMIG
    "counter",  # at most 32 a counter set (the API server's limit)
    "peer_gpu",  # the other GPU of a pair (--detail only: n² / 2 a node)
    "level",  # how two GPUs reach each other: nvlink, pix, pxb, phb, node, sys
    "shared_with",  # whose a thread beside a pod's exclusive CPU is: three values
    "policy",  # the kubelet's CPU manager policy: none, static
    "reserved_cpus",  # the kubelet's reservedSystemCPUs: one list a node
    "option",  # a CPU manager policy option: the kubelet knows six
    "setting",  # its value as written: true, false
    "nvlinks",  # NVLinks joining a pair: at most NVML_NVLINK_MAX_LINKS
    "p2p",  # yes, no, unknown
    "size",  # a set of free GPUs: 2, 4 or 8
}


def test_names_and_labels_follow_conventions():
    for name, spec in CATALOGUE.items():
        # the process's own, by the names every client library gives them
        assert name.startswith("process_" if spec.group == "process" else "numaguard_"), name
        assert (spec.kind == "counter") == name.endswith("_total"), name
        labels = set(spec.labels) - {"node"}
        assert labels <= ALLOWED_LABELS, (name, labels - ALLOWED_LABELS)
        # the exporter adds node to every series itself; the remediator's name the node
        assert ("node" in spec.labels) <= (spec.group == "remediator"), name
        assert spec.help.strip() and spec.group


async def test_everything_exported_is_declared_with_its_labels(fake_root):
    seen = set()
    # the second with AMD's assignable counters, fewer than its groups need
    for preset, counters in ((presets.two_socket, None), (presets.four_node_v1, 4)):
        host = preset()
        root = fake_root(host)
        kernel = FakeResctrl(
            root.root, host, num_rmids=len(host.pods), abmc_counters=counters
        ).write()
        collection = make_collection(root, metadata=metadata_of(host), resctrl=kernel)
        await collection.run_once()
        for node in host.nodes:
            node.numastat.update(local_node=10, other_node=1)
        if host.balancing is not None:
            host.balancing.update(numa_hint_faults=4, numa_hint_faults_local=3)
        for pod in host.pods:
            kernel.add_traffic(pod.uid, 0, total=100, local=60)
            kernel.set_occupancy(pod.uid, 0, 4096)
        root.write()
        kernel.write()
        await collection.run_once()
        seen |= _declared_families(collection)
    # and a GPU node with its kubelet, over two cycles so that utilization has an interval
    now = [0.0]
    host, nvml = presets.gpu_node(lambda: now[0])
    host.threads_per_core = 2  # a pod's core isolation: its siblings, how busy they were
    host.kubelet_config["cpuManagerPolicyOptions"] = {"full-pcpus-only": "true"}
    host.cpu_ticks = {c: (10, 90) for c in host.all_cpus}
    # two L3 caches a NUMA node, of whole cores: the room a pod kept to one cache has
    halves = ("0-7,16-23", "8-15,24-31", "32-39,48-55", "40-47,56-63")
    host.l3 = [(cpus, 32 * MIB) for cpus in halves]
    root = fake_root(host)
    async with gpu_collection(host, nvml, root, lambda: now[0]) as (collection, gpus):
        gpus.start()
        collection.nrt_current = lambda: True  # as with --nrt, its topology published
        nvml.set_mig(7, [])  # GPU 7 under NVIDIA's DynamicMIG: its DRA counters
        collection.dra = lambda: dra.view(NODE, nvml, [7], dynamic=True)
        # as with --memory-mover, after a move, a refusal and two pages that stayed
        moves = MoveTotals(Counter(moved=1, refused=1), Counter(mems=1), Counter(EACCES=2))
        collection.moves = lambda: moves
        await collection.run_once()
        now[0] += 15
        host.cpu_ticks = {c: (30, 170) for c in host.all_cpus}
        root.write()
        await collection.run_once()
    seen |= _declared_families(collection)
    # and PCIe cards whose pods hold several GPUs and slices, in one container or two
    host, nvml = presets.linked_gpu_node(lambda: now[0])
    async with gpu_collection(host, nvml, fake_root(host), lambda: now[0]) as (collection, _):
        await collection.run_once()
        now[0] += 15  # NVLink traffic is measured between two GPM samples
        await collection.run_once()
    seen |= _declared_families(collection)
    # and NVLink-bridged cards, one held by a single-GPU pod: the free sets a pod could
    # get, and the pair that pod breaks
    host = FakeHost(nodes=[FakeNumaNode("0-7", socket=0), FakeNumaNode("8-15", socket=1)])
    nvml = FakeNvml()
    gpu_topology.bridged(nvml, host)
    holding(host, nvml, {"single": [0]})
    async with gpu_collection(host, nvml, fake_root(host), time.monotonic) as (collection, _):
        await collection.run_once()
    seen |= _declared_families(collection)
    # every declared exporter metric shows up on at least one of these nodes (the
    # remediator's own are checked against its /metrics in test_remediation)
    assert seen == {n for n, spec in CATALOGUE.items() if spec.group != "remediator"}


def _declared_families(collection) -> set[str]:
    """Names of the families with samples; each must be declared with exactly its labels."""
    seen = set()
    for family in text_string_to_metric_families(collection.exposition.text.decode()):
        name = family.name + ("_total" if family.type == "counter" else "")
        assert name in CATALOGUE, name
        spec = CATALOGUE[name]
        for sample in family.samples:
            assert set(sample.labels) == {"node", *spec.labels}, (name, sample.labels)
        if family.samples:
            seen.add(name)
    return seen


def test_help_is_ascii():
    """One character past ASCII makes the whole joined exposition a 2-byte-per-character
    string before it is encoded: a tenth of the cycle, for a Greek delta."""
    assert [m.name for m in CATALOGUE.values() if not m.help.isascii()] == []


def test_metrics_doc_is_generated_from_the_catalogue():
    doc = Path(__file__).parent.parent / "docs" / "metrics.md"
    assert doc.read_text() == docs.metrics_markdown(), "run: make docs"


def test_the_configuration_doc_s_flags_are_the_current_help():
    from numaguard.exporter import docs

    text = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    assert docs.with_help(text) == text, "run: make docs"


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from numaguard.exporter.cli import parser as exporter_parser
    from numaguard.exporter.mover.helper import parser as helper_parser
    from numaguard.remediator.arguments import parser as remediator_parser

    out = {"numaguard-exporter": exporter_parser(), "numaguard-memory-mover": helper_parser()}
    remediator = remediator_parser()
    (commands,) = [a for a in remediator._actions if isinstance(a, argparse._SubParsersAction)]
    for name, sub in commands.choices.items():
        out[f"numaguard-remediator {name}"] = sub
    return out


@pytest.mark.parametrize("command", sorted(_parsers()))
def test_every_flag_says_what_it_does_and_its_default_plainly(command):
    """No "(default: None)" or "(default: )", no byte count in raw digits, and no flag
    without a word of help (argparse then shows neither help nor default)."""
    parser = _parsers()[command]
    text = " ".join(parser.format_help().split())
    assert "(default: None)" not in text and "(default: )" not in text
    assert not re.search(r"default: \d{7,}", text)
    silent = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
    assert silent == []

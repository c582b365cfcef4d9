"""The collector registry: every collector is one COLLECTOR record in its own module, and
a new one runs (its flag's setting, its source, its health and its families) with only
its own files written."""

from __future__ import annotations

import importlib
import inspect
import sys
import textwrap

from numaguard.exporter import collectors
from numaguard.exporter.collection import Collection
from numaguard.exporter.collectors import COLLECTORS, METADATA, registered
from numaguard.exporter.model import build_snapshot
from numaguard.exporter.server import open_sources
from numaguard.exporter.settings import Settings
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import FakeHostRoot
from tests.conftest import NODE, samples, series

# A collector of the host's uptime: its collector module (registered by being in the
# collectors package) and its source module, and nothing else.
UPTIME_COLLECTOR = """
from numaguard.contract.catalogue import MetricSpec
from numaguard.exporter.exposition import Family
from numaguard.exporter.collectors import Collector

UPTIME = MetricSpec("numaguard_test_uptime_seconds", "gauge", "Seconds since boot.")


def families(snap):
    family = Family(UPTIME, snap.node_name)
    reading = snap.readings.get("uptime")
    if reading is not None:
        family.add(reading.seconds)
    return [family]


COLLECTOR = Collector(
    name="uptime",
    help="seconds since boot (procfs)",
    source="uptime_source",
    families=families,
)
"""
UPTIME_SOURCE = """
import os
from dataclasses import dataclass, field


@dataclass
class Uptime:
    seconds: float
    issues: list = field(default_factory=list)


class UptimeSource:
    def __init__(self, host_root):
        self.path = os.path.join(host_root, "proc/uptime")

    def read(self):
        with open(self.path) as f:
            return Uptime(float(f.read().split()[0]))


def open_source(settings):
    return UptimeSource(settings.host_root)
"""


def test_each_collector_module_registers_one_collector_whose_source_opens():
    assert sorted(COLLECTORS) == [
        "gpu",
        "host_numa",
        "pod_placement",
        "pod_resources",
        "resctrl",
    ]
    for name, collector in COLLECTORS.items():
        assert collector.name == name and collector.help
        assert callable(importlib.import_module(collector.source).open_source)
        keywords = inspect.signature(build_snapshot).parameters
        assert collector.reading is None or keywords[collector.reading].kind.name == "KEYWORD_ONLY"
        for read in collector.reads:
            assert read == METADATA or read in COLLECTORS, (name, read)


async def test_a_new_collector_needs_only_its_own_files(tmp_path, monkeypatch):
    package, sources = tmp_path / "collectors", tmp_path / "sources"
    package.mkdir()
    sources.mkdir()
    (package / "uptime.py").write_text(textwrap.dedent(UPTIME_COLLECTOR))
    (sources / "uptime_source.py").write_text(textwrap.dedent(UPTIME_SOURCE))
    monkeypatch.setattr(collectors, "__path__", [*collectors.__path__, str(package)])
    monkeypatch.syspath_prepend(str(sources))
    for module in ("numaguard.exporter.collectors.uptime", "uptime_source"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    root = FakeHostRoot(tmp_path / "host", presets.two_socket()).write()
    (root.root / "proc" / "uptime").write_text("12345.67 40000.00\n")

    found = registered()
    assert set(found) == {*COLLECTORS, "uptime"}
    settings = Settings(host_root=str(root.root), collectors=frozenset({"uptime", "host_numa"}))
    opened = await open_sources(settings, found)
    assert set(opened) == {"uptime", "host_numa"}
    collection = Collection(NODE, opened, collectors=found)
    await collection.run_once()

    got = samples(collection.exposition.text)
    assert got[series("numaguard_test_uptime_seconds")] == 12345.67
    assert got[series("numaguard_collector_success", collector="uptime")] == 1
    assert got[series("numaguard_collector_success", collector="host_numa")] == 1
    assert (series("numaguard_collector_success", collector="pod_placement")) not in got

    (root.root / "proc" / "uptime").write_text("not a number\n")
    await collection.run_once()  # its failure is its own: counted, the cycle goes on
    got = samples(collection.exposition.text)
    assert got[series("numaguard_collector_success", collector="uptime")] == 0
    errors = series("numaguard_collector_errors_total", collector="uptime", reason="internal")
    assert got[errors] == 1
    assert series("numaguard_test_uptime_seconds") not in got
    assert got[series("numaguard_collector_success", collector="host_numa")] == 1


async def test_each_collector_counts_only_the_errors_its_source_can_have(fake_root):
    """numaguard_collector_errors_total starts at 0 for the reasons a collector's source
    can fail for, and only those: no host_numa x gpu_lost series to alert or graph on."""
    root = fake_root(presets.two_socket())
    settings = Settings(host_root=str(root.root), node_name=NODE, gpu_backend="none")
    collection = Collection(NODE, await open_sources(settings))
    await collection.run_once()
    got = samples(collection.exposition.text)
    reasons: dict[str, set[str]] = {}
    for name, labels in got:
        if name == "numaguard_collector_errors_total":
            reasons.setdefault(dict(labels)["collector"], set()).add(dict(labels)["reason"])
    assert reasons["host_numa"] == {*COLLECTORS["host_numa"].errors, "timeout", "internal"}
    assert "gpu_lost" not in reasons["host_numa"] and "write" not in reasons["pod_placement"]
    assert "write" in COLLECTORS["resctrl"].errors
    assert {"gpu_lost", "nvml", "driver"} <= set(COLLECTORS["gpu"].errors)
    assert (
        got[series("numaguard_collector_errors_total", collector="host_numa", reason="parse")] == 0
    )

"""Collectors: a NodeSnapshot -> metric families. Thin: every value is already in the
snapshot; a collector only names it.

Each module here registers one collector with a ``COLLECTOR`` record, and the package
finds them: the record says everything the exporter needs to run it (its flag and help,
how its source is made, what that source is given, where its reading goes in the
snapshot, and its families), so adding a collector touches no shared file but the
catalogue. docs/design.md, "Adding a collector", walks through one.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from numaguard.exporter.records import READ_FAILURES

if TYPE_CHECKING:
    from numaguard.exporter.exposition import Family
    from numaguard.exporter.model import NodeSnapshot

# What a source's read may be given besides other collectors' readings: the pods' names
# from the API server (None when it is not in use or not yet synced).
METADATA = "metadata"


@dataclass(frozen=True)
class Collector:
    name: str  # the "collector" label, and --collector.<name>
    help: str  # for --help
    # the module whose open_source(settings) makes this collector's source; it returns
    # None where the node has nothing to read, and the collector is then left out
    source: str
    families: Callable[[NodeSnapshot], Iterable[Family]]
    # build_snapshot's keyword for the reading; None: the model derives nothing from it,
    # and families find it in snapshot.readings by the collector's name
    reading: str | None = None
    # what the source's read is given, in order: METADATA, or another collector's name
    # for that collector's reading this cycle (read after it; None when it is off)
    reads: tuple[str, ...] = ()
    default: bool = True  # on unless --no-collector.<name>
    # the reasons its source can fail for (besides timeout and internal, which any can):
    # its numaguard_collector_errors_total series start at 0, and only these. Beyond a
    # file's READ_FAILURES: write (the kernel refused a resctrl group change or task
    # move), gpu_lost (a GPU fell off the bus), nvml (another NVML error than
    # not-supported), driver (a GPU node's driver cannot be loaded), kubelet (the
    # PodResources API answered an error)
    errors: tuple[str, ...] = READ_FAILURES


def registered() -> dict[str, Collector]:
    """Every collector a module of this package registers, by name."""
    found: dict[str, Collector] = {}
    for module in pkgutil.iter_modules(__path__, f"{__name__}."):
        record = getattr(importlib.import_module(module.name), "COLLECTOR", None)
        if isinstance(record, Collector):
            if record.name in found:
                raise ValueError(f"two collectors named {record.name!r}")
            found[record.name] = record
    return dict(sorted(found.items()))


COLLECTORS = registered()

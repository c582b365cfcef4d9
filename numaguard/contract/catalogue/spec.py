"""What a metric's declaration is, and the register every declaration goes into: the
catalogue's own machinery. The declarations are its sibling modules, by topic."""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "numaguard_"
NODE_LABEL = "node"
_UNITS = ("bytes", "seconds", "ratio")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # as exposed; counters end in _total
    kind: str  # gauge | counter | histogram (the remediator's only)
    help: str
    labels: tuple[str, ...] = ()  # besides "node"
    group: str = ""
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds
    # a breakdown a fleet need not pay for: exported only with the exporter's --detail
    detail: bool = False

    @property
    def unit(self) -> str:
        base = self.name.removesuffix("_total")
        return next((u for u in _UNITS if base.endswith("_" + u)), "")

    @property
    def series(self) -> tuple[str, ...]:
        """The names its samples are exposed under, as queries select them."""
        if self.kind == "histogram":
            return tuple(f"{self.name}_{part}" for part in ("bucket", "sum", "count"))
        return (self.name,)


CATALOGUE: dict[str, MetricSpec] = {}


def declare(
    name: str,
    kind: str,
    help: str,
    labels: tuple[str, ...] = (),
    group: str = "",
    buckets: tuple[float, ...] = (),
    detail: bool = False,
) -> MetricSpec:
    spec = MetricSpec(PREFIX + name, kind, help, labels, group, buckets, detail)
    assert spec.name not in CATALOGUE, spec.name
    CATALOGUE[spec.name] = spec
    return spec


def declare_process(name: str, kind: str, help: str) -> MetricSpec:
    """A metric of the process itself, by the name every Prometheus client library gives
    it (no numaguard_ prefix: dashboards for any exporter use these)."""
    spec = MetricSpec(name, kind, help, (), "process")
    assert spec.name not in CATALOGUE, spec.name
    CATALOGUE[spec.name] = spec
    return spec


# Label sets shared by many metrics.
CONTAINER = ("namespace", "pod", "container", "pod_uid", "container_id")
POD = ("namespace", "pod", "pod_uid")
COLLECTOR = ("collector",)


def series_names() -> set[str]:
    """Every name a query (an alert's, a dashboard's, the remediator's) may select: each
    metric's, a histogram's _bucket, _sum, _count; never a detail metric's, which an
    exporter exports only with --detail."""
    return {name for spec in CATALOGUE.values() if not spec.detail for name in spec.series}

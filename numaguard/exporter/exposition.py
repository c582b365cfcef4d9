"""Rendering metric families to the Prometheus text format (0.0.4) and OpenMetrics 1.0.

prometheus_client renders the same bytes (a test holds the two equal) but spends ~40 µs
per sample validating names it does not know to be safe; at 10k series per cycle that
alone is ten times the CPU budget (docs/design.md). Our names and label names are fixed in the
catalogue and checked by its tests, so only label values need escaping, and each sample
line is rendered once, as it is added (Family), for both formats.
"""

from __future__ import annotations

import math

from numaguard.contract.catalogue import CATALOGUE, NODE_LABEL, MetricSpec

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


class LabelPrefix:
    """Leading label pairs (``,namespace="a",pod="b"``) shared by the many series of one
    container or pod; rendered only for a series not rendered last cycle."""

    __slots__ = ("_text", "names", "values")

    def __init__(self, names: tuple[str, ...], values: tuple[str, ...]) -> None:
        self.names = names
        self.values = values
        self._text: str | None = None

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = _pairs(self.names, self.values)
        return self._text


class Family:
    """The samples of one catalogue metric for one node, filled by a collector.

    Each sample is rendered to its exposition line as it is added (the same line serves
    the text format and OpenMetrics); the exposition only joins them. A series' line up
    to its value is rendered once: the last cycle's are looked up by label values.
    """

    __slots__ = ("_head", "_heads", "_known", "lines", "node", "spec")

    def __init__(self, spec: MetricSpec, node: str) -> None:
        self.spec = spec
        self.node = node
        self.lines: list[str] = []
        self._head = f'{spec.name}{{{NODE_LABEL}="{escape_label_value(node)}"'
        # this cycle's rendered heads replace the last one's: the series gone go too
        self._known = _HEADS.get((spec.name, node), {})
        self._heads: dict[tuple, str] = {}
        _HEADS[(spec.name, node)] = self._heads

    def add(self, value: float, *values: str) -> None:
        """Label values in the spec's order."""
        head = self._known.get(values)
        if head is None:
            head = f"{self._head}{_pairs(self.spec.labels, values)}}} "
        self._heads[values] = head
        self.lines.append(f"{head}{value if type(value) is int else format_value(value)}\n")

    def add_under(self, prefix: LabelPrefix, value: float, *values: str) -> None:
        """Label values after the leading ones that ``prefix`` holds rendered."""
        key = (prefix.values, values)
        head = self._known.get(key)
        if head is None:
            names = self.spec.labels[len(prefix.names) :]
            head = f"{self._head}{prefix.text}{_pairs(names, values)}}} "
        self._heads[key] = head
        self.lines.append(f"{head}{value if type(value) is int else format_value(value)}\n")


class Unexported(Family):
    """A detail family the exporter was not asked for: what is added to it is dropped
    before any line is rendered."""

    __slots__ = ()

    def __init__(self, spec: MetricSpec, node: str) -> None:
        self.spec, self.node, self.lines = spec, node, []

    def add(self, value: float, *values: str) -> None:
        pass

    def add_under(self, prefix: LabelPrefix, value: float, *values: str) -> None:
        pass


class Families(dict):
    """One collector's families for one node, by metric name: every metric of its group
    in the catalogue; the detail ones only when ``detail`` (--detail)."""

    def __init__(self, group: str, node: str, detail: bool = False) -> None:
        super().__init__(
            (spec.name, (Family if detail or not spec.detail else Unexported)(spec, node))
            for spec in CATALOGUE.values()
            if spec.group == group
        )

    def add(self, spec: MetricSpec, value: float | None, *labels: str) -> None:
        """A sample, unless its value is unknown (None): then no series, never a made-up
        number."""
        if value is not None:
            self[spec.name].add(value, *labels)

    def add_under(
        self, spec: MetricSpec, prefix: LabelPrefix, value: float | None, *labels: str
    ) -> None:
        """The same, with the leading label values that ``prefix`` holds."""
        if value is not None:
            self[spec.name].add_under(prefix, value, *labels)


# (metric, node) -> the heads of its series' lines last cycle, by label values
_HEADS: dict[tuple[str, str], dict[tuple, str]] = {}


def format_value(value: float) -> str:
    """A sample value as both exposition formats write it."""
    if type(value) is int:
        return str(value)
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def escape_label_value(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _pairs(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    if len(names) != len(values):
        raise ValueError(f"labels {names} got values {values}")
    return "".join([f',{n}="{escape_label_value(v)}"' for n, v in zip(names, values, strict=True)])


def render(families: list[Family]) -> tuple[bytes, bytes]:
    """(text format 0.0.4, OpenMetrics 1.0): the sample lines are the same in both, so
    each family's are joined and encoded once and both formats are joined as bytes (no
    megabyte-long str is made, nor encoded twice: fresh pages cost more than the copy)."""
    text: list[bytes] = []
    om: list[bytes] = []
    for fam in families:
        if not fam.lines:  # no HELP and TYPE without a sample, as node_exporter
            continue
        spec = fam.spec
        name = spec.name
        body = "".join(fam.lines).encode()
        text.append(
            f"# HELP {name} {_escape_help(spec.help, False)}\n# TYPE {name} {spec.kind}\n".encode()
        )
        text.append(body)
        base = name.removesuffix("_total") if spec.kind == "counter" else name
        unit = f"# UNIT {base} {spec.unit}\n" if spec.unit else ""
        om.append(
            f"# HELP {base} {_escape_help(spec.help, True)}\n# TYPE {base} {spec.kind}\n"
            f"{unit}".encode()
        )
        om.append(body)
    om.append(b"# EOF\n")
    return b"".join(text), b"".join(om)


def _escape_help(text: str, openmetrics: bool) -> str:
    text = text.replace("\\", r"\\").replace("\n", r"\n")
    return text.replace('"', r"\"") if openmetrics else text

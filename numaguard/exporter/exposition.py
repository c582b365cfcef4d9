"""Rendering metric families to the Prometheus text format (0.0.4) and OpenMetrics 1.0.

prometheus_client renders the same bytes (a test holds the two equal) but spends ~40 µs
per sample validating names it does not know to be safe; at 10k series per cycle that
alone is ten times the CPU budget (docs/design.md). Our names and label names are fixed in the
catalogue and checked by its tests, so only label values need escaping, and each sample
line is rendered once, as it is added (catalogue.Family), for both formats.
"""

from __future__ import annotations

from numaguard.exporter.catalogue import Family

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def render(families: list[Family]) -> tuple[bytes, bytes]:
    """(text format 0.0.4, OpenMetrics 1.0): the sample lines are the same in both, so
    each family's are joined and encoded once and both formats are joined as bytes (no
    megabyte-long str is made, nor encoded twice: fresh pages cost more than the copy)."""
    text: list[bytes] = []
    om: list[bytes] = []
    for fam in families:
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

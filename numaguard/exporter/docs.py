"""Regenerate the reference docs from the code: ``python -m numaguard.exporter.docs``.

docs/metrics.md comes from the metric catalogue, docs/configuration.md's flags block from
``numaguard-exporter --help``; tests fail when either is stale.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from numaguard.contract import catalogue
from numaguard.exporter import cli

ROOT = Path(__file__).resolve().parents[2]
HELP_BLOCK = re.compile(r"(<!-- exporter-help:start -->\n).*?(<!-- exporter-help:end -->)", re.S)


def exporter_help() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal; docs want one width
    return cli.parser().format_help()


def with_help(text: str) -> str:
    return HELP_BLOCK.sub(lambda m: f"{m[1]}```\n{exporter_help()}```\n{m[2]}", text)


def metrics_markdown() -> str:
    """The catalogue as a Markdown reference (docs/metrics.md is generated from this)."""
    lines = [
        "# Metrics",
        "",
        "Generated from `numaguard/contract/catalogue/` by `make docs`; do not edit.",
        f"Every series also carries `{catalogue.NODE_LABEL}`. Metrics marked *detail* are",
        "exported only with the exporter's `--detail`: breakdowns a fleet need not pay for",
        "(every container's series, every pod's CPUs per NUMA node, per-L3-domain traffic",
        "counters, per-slice PCIe). Every alert, dashboard panel and remediator query reads",
        "the others only.",
        "",
    ]
    for group in dict.fromkeys(spec.group for spec in catalogue.CATALOGUE.values()):
        lines += [f"## {group}", "", "| metric | type | labels | meaning |", "|---|---|---|---|"]
        for spec in catalogue.CATALOGUE.values():
            if spec.group == group:
                labels = ", ".join(f"`{label}`" for label in spec.labels) or "-"
                detail = " *detail*" if spec.detail else ""
                lines.append(f"| `{spec.name}`{detail} | {spec.kind} | {labels} | {spec.help} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    (ROOT / "docs" / "metrics.md").write_text(metrics_markdown())
    configuration = ROOT / "docs" / "configuration.md"
    configuration.write_text(with_help(configuration.read_text()))


if __name__ == "__main__":
    main()

"""Regenerate the reference docs from the code: ``python -m numaguard.exporter.docs``.

docs/metrics.md comes from the metric catalogue, the README's configuration block from
``numaguard-exporter --help``; tests fail when either is stale.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from numaguard.exporter import catalogue, cli

ROOT = Path(__file__).resolve().parents[2]
HELP_BLOCK = re.compile(r"(<!-- exporter-help:start -->\n).*?(<!-- exporter-help:end -->)", re.S)


def exporter_help() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal; docs want one width
    return cli.parser().format_help()


def readme_with_help(readme: str) -> str:
    return HELP_BLOCK.sub(lambda m: f"{m[1]}```\n{exporter_help()}```\n{m[2]}", readme)


def main() -> None:
    (ROOT / "docs" / "metrics.md").write_text(catalogue.markdown())
    readme = ROOT / "README.md"
    readme.write_text(readme_with_help(readme.read_text()))


if __name__ == "__main__":
    main()

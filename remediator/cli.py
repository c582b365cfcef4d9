"""``numaguard-remediator``: command line (the control loop arrives with its own issue)."""

from __future__ import annotations

import argparse
import sys

from exporter import __version__


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="numaguard-remediator",
        description=(
            "Cluster controller that finds cross-socket, GPU-starved and badly sized MIG "
            "workloads from the exporter's metrics and fixes them safely (dry-run by "
            "default). Not implemented in this release: it only prints this help."
        ),
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    parser().parse_args(argv)
    parser().print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())

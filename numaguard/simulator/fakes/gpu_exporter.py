"""The exporter on a simulated GPU node:
``python -m numaguard.simulator.fakes.gpu_exporter GPUS.json [numaguard-exporter's arguments]``.

It puts the fake NVML that GPUS.json describes (``FakeNvml.description()``; re-read
whenever the file changes) behind pynvml's C boundary, then runs numaguard-exporter with
the rest of the arguments: the product sees a driver, and knows nothing of the fake.
"""

from __future__ import annotations

import sys

from numaguard.exporter import cli
from numaguard.simulator.fakes.nvml import FakeNvml


def fake_gpus(path: str) -> FakeNvml:
    """The fake GPU node described in ``path``, following the file as it changes;
    ``.install()`` it (or ``with .installed():``) to be this process's NVML library."""
    with open(path) as f:
        fake = FakeNvml.from_description(f.read())
    fake.follow(path)
    return fake


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path, *args = argv
    try:
        fake_gpus(path).install()
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(
            f"simulator.fakes.gpu_exporter: cannot use the fake GPU node in {path}: {err!r}",
            file=sys.stderr,
        )
        return 2
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main())

"""``make bench``: every benchmark, one table. Each measures numaguard next to its peer
in the same run (reading the same files; node_exporter on the same host root; the raw
NVML and gRPC calls); the date, machine and Python it ran on head the table."""

from __future__ import annotations

import datetime
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = ("series.py", "cycle.py", "scrape.py", "planning.py", "remediation.py", "decisions.py")


def main() -> None:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    print(
        f"numaguard benchmarks, {datetime.date.today()}, {cpu}, "
        f"{len(Path('/proc/cpuinfo').read_text().split('processor')) - 1} CPUs, "
        f"Python {platform.python_version()}"
    )
    header_printed = False
    for bench in BENCHES:
        run = subprocess.run([sys.executable, str(HERE / bench)], capture_output=True, text=True)
        if run.returncode != 0:
            print(f"{bench} failed:\n{run.stderr[-2000:]}", file=sys.stderr)
            sys.exit(1)
        for line in run.stdout.splitlines():
            if line.startswith("measure"):
                if not header_printed:
                    print(f"{line}   [bench]")
                    header_printed = True
                continue
            if line.startswith(("reference node", "cluster")):
                print(f"# {line}")
                continue
            print(f"{line}   [{bench}]" if line.strip() else line)


if __name__ == "__main__":
    main()

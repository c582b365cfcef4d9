"""``make demo`` runs the exporter on the simulated GPU node and shows what it finds."""

from __future__ import annotations

import subprocess
import sys

from simulator.processes import free_port


def test_demo_shows_the_findings_and_stops_cleanly():
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "simulator.demo",
            "--seconds",
            "5",
            "--interval",
            "1",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    last = run.stdout.rsplit("--- after", 1)[1]
    rows = {line.split()[0]: line for line in last.splitlines()[2:] if line.strip()}
    assert "memory_remote" in rows["cache/redis-cache"]
    assert "STARVED by device_remote+cpu_pressure" in rows["ml/trainer-remote"]
    assert "gpu1 3g.40gb" in rows["ml/infer-a"] and "60%" in rows["ml/infer-a"]
    assert rows["ml/trainer"].endswith("aligned")
    assert "the exporter shut down cleanly" in run.stdout

"""The demos: ``make demo`` (the whole loop on a simulated cluster) and the single-node
exporter view (``python -m numaguard.simulator.demo``)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from numaguard.simulator.controlplane import parts_dir
from numaguard.simulator.processes import free_port

pytestmark = pytest.mark.cluster


def test_demo_shows_the_findings_and_stops_cleanly():
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "numaguard.simulator.demo",
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


# the demo settles in its own time, at most --seconds; the test waits a little longer
# than that, and its own timeout longer still
DEMO_SECONDS = 400


@pytest.mark.timeout(DEMO_SECONDS + 120)
def test_the_whole_loop_demo():
    """The demo on the real control plane; while it runs, kubectl sees the live cluster."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "numaguard.simulator.loop_demo", "--seconds", str(DEMO_SECONDS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        for line in demo.stdout:
            lines.append(line)
            if "get pods -A -o wide" in line:
                break
        command = line.split()  # kubectl --kubeconfig <path> get pods -A -o wide
        listed = subprocess.run(
            [str(parts_dir() / "kubectl"), *command[1:]],
            capture_output=True,
            text=True,
            timeout=60,
        )
        out, err = demo.communicate(timeout=DEMO_SECONDS + 60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert listed.returncode == 0, listed.stderr
    pods = [row.split() for row in listed.stdout.splitlines()[1:]]
    assert ["team-gpu-a", "trainer-remote", "1/1", "Running"] in [p[:4] for p in pods]
    assert {p[7] for p in pods} == {"gpu-a", "gpu-b", "gpu-c"}  # NODE, from the scheduler
    assert demo.returncode == 0, err[-2000:]
    out = "".join(lines) + out
    assert "Prometheus (rules loaded): http://127.0.0.1:" in out
    assert "evict team-gpu-a/trainer-remote (cross_numa:device_remote) -> evicted" in out
    assert "-> pdb_blocked" in out  # gpu-b's budget
    # every fix prints what it gained: gpu-a's trainer, fed across sockets at 0.1, runs at
    # its demand (0.8) once aligned; gpu-b's loader waits on its input wherever it runs
    # (a little under 0.1 at first: its first GPM interval began before it ran)
    assert re.search(
        r"verified Deployment/team-gpu-a/trainer-remote: held \(GPU activity 0\.1\d -> "
        r"0\.[78]\d after moving to gpu-a NUMA node 0: gain [6-9]\.\d\d\)",
        out,
    ), out
    assert re.search(
        r"verified Deployment/team-gpu-b/loader: no_gain \(GPU activity 0\.1\d -> 0\.(09|1\d) "
        r"after moving to gpu-b NUMA node [01]: gain (0\.9\d|1\.0\d)\)",
        out,
    ), out
    assert "verified Deployment/team-gpu-c/trainer-remote: did_not_hold" in out
    assert "verified Deployment/team-gpu-c/trainer-remote: gave_up" in out
    assert "settled: every fix verified or refused for good" in out  # not out of time
    summary = out.rsplit("before / after", 1)[1]
    gained = summary.split("fixes and what they gained:\n", 1)[1].split("  refusals", 1)[0]
    assert "Deployment/team-gpu-a/trainer-remote: held, GPU activity" in gained
    assert "Deployment/team-gpu-b/loader: no_gain, GPU activity" in gained
    assert "protected_namespace" in summary  # the kube-system pod, never touched
    # steered, every replacement on a node whose zone the plan found to fit (gpu-c's
    # pinned trainer too: its `none` kubelet misplaces it there, and it gives up)
    assert re.search(r"replacements landed \(steered\): planned \d+\n", summary), summary
    before, after = (
        int(x) for x in summary.split("pods placed across NUMA nodes")[1].split()[0:3:2]
    )
    assert after < before

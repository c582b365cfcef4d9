"""The demos: ``make demo`` (the whole loop on a simulated cluster) and the single-node
exporter view (``python -m numaguard.simulator.demos.exporter_view``)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from numaguard.simulator.parts.controlplane import parts_dir
from numaguard.simulator.parts.processes import free_port

pytestmark = pytest.mark.cluster


def _settled(view: str) -> bool:
    """The view shows every finding the demo node has: each needs a few collections
    (the feeder's CPU pressure is a rate), however long those take on a loaded machine."""
    rows = {line.split()[0]: line for line in view.splitlines()[1:] if line.strip()}
    return (
        "memory_remote" in rows.get("cache/redis-cache", "")
        and "STARVED by device_remote+cpu_pressure" in rows.get("ml/trainer-remote", "")
        and "gpu1 3g.40gb" in rows.get("ml/infer-a", "")
        and "60%" in rows.get("ml/infer-a", "")
        and rows.get("ml/trainer", "").endswith("aligned")
        and rows.get("ml/allreduce", "").endswith("no_p2p")
    )


def test_demo_shows_the_findings_and_stops_cleanly():
    """Its live view comes to show every finding; SIGTERM then stops it cleanly."""
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "numaguard.simulator.demos.exporter_view",
            "--seconds",
            "300",
            "--interval",
            "1",
            "--port",
            str(free_port()),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    views, view = [], []
    try:
        for line in demo.stdout:
            if line.startswith("--- after"):
                view = []
            elif line.strip():
                view.append(line)
            elif view:  # a view ends with a blank line
                views.append("".join(view))
                if _settled(views[-1]):
                    demo.terminate()
                    break
        out, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert views and _settled(views[-1]), views[-1:]
    assert demo.returncode == 0, err[-2000:]
    assert "the exporter shut down cleanly" in out, out[-2000:]


# the demo settles in its own time, at most --seconds; the test waits a little longer
# than that, and its own timeout longer still
DEMO_SECONDS = 400


@pytest.mark.timeout(DEMO_SECONDS + 120)
def test_the_whole_loop_demo():
    """The demo on the real control plane; while it runs, kubectl sees the live cluster."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "numaguard.simulator.demos.loop", "--seconds", str(DEMO_SECONDS)],
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
    # what is left misplaced is named, with the remediator's last word on it
    left = summary.split("still misplaced, and why:\n", 1)[1]
    assert re.search(r"team-gpu-c/trainer-remote-\S+ \([a-z_, ]+\): gave_up: ", left), left

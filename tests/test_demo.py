"""The demos: ``make demo`` (the whole loop on a simulated cluster) and the single-node
exporter view (``python -m numaguard.simulator.demos.exporter_view``)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from numaguard.simulator.parts.controlplane import parts_dir
from numaguard.simulator.parts.processes import free_port, get, until
from tests.helpers.browser import drawn_or_row, parsed, rendered, screenshot

pytestmark = pytest.mark.cluster


def stopped(demo: subprocess.Popen) -> None:
    """A demo a failed check left running, interrupted as Ctrl-C does, so that it stops
    the control plane, exporters and Prometheus it started (killed, they would outlive
    it); killed only if it will not go."""
    if demo.poll() is None:
        demo.send_signal(signal.SIGINT)
        try:
            demo.wait(60)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait()


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
        stopped(demo)
    assert views and _settled(views[-1]), (views[-1:], err[-2000:])
    assert demo.returncode == 0, err[-2000:]
    assert "the exporter shut down cleanly" in out, out[-2000:]


# the demo settles in its own time, at most --seconds; the test waits a little longer
# than that, and its own timeout longer still
DEMO_SECONDS = 400


async def trainer(placement: str, judged: bool) -> tuple[str, dict]:
    """gpu-a's remote-GPU trainer as its placement map's JSON has it (uid, pod), once it
    has a verdict (``judged``) or none."""

    async def found():
        pods = json.loads(await get(placement + "?format=json"))["pods"]
        return next(
            (
                (uid, p)
                for uid, p in pods.items()
                if p["namespace"] == "team-gpu-a"
                and p["name"].startswith("trainer-remote")
                and bool(p["verdicts"]) == judged
            ),
            None,
        )

    return await until(found, f"gpu-a's trainer {'with' if judged else 'without'} a verdict", 120)


async def looked_at(before: Path, placement: str, decided: str):
    """Chromium's DOM of the map before (as saved), the live map and decision page after,
    and what the live pages asked for; a screenshot of each."""
    before_dom, _ = await rendered(before.as_uri())
    after_dom, asked = await rendered(placement)
    decisions_dom, asked_too = await rendered(decided)
    for url, name in (
        (before.as_uri(), "demo-gpu-a-before"),
        (placement, "demo-gpu-a-after"),
        (decided, "demo-decisions"),
    ):
        await screenshot(url, name)
    return before_dom, after_dom, decisions_dom, asked + asked_too


def trainer_marks(dom: str, uid: str) -> list[tuple[str, dict]]:
    """What the page draws of the pod ``uid``: its CPUs, devices and legend row."""
    return [
        (t, a) for t, a, _ in parsed(dom).found if a.get("data-pod") == uid and drawn_or_row(t, a)
    ]


@pytest.mark.browser
@pytest.mark.timeout(DEMO_SECONDS + 240)
def test_the_whole_loop_demo(tmp_path):
    """The demo on the real control plane; while it runs, kubectl sees the live cluster,
    and Chromium shows the remediated trainer on gpu-a's placement map before and after
    its fix, and the decision page saying so."""
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "numaguard.simulator.demos.loop",
            "--seconds",
            str(DEMO_SECONDS),
            "--hold",
        ],
        stdin=subprocess.PIPE,
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
        said = "".join(lines)
        (placement,) = re.findall(r"exporter gpu-a: \S+ +placement map: (\S+)", said)
        (decided,) = re.findall(r"the remediator's decisions: (\S+)", said)
        # before: the trainer on gpu-a with its verdict, as the exporter draws it then
        before = asyncio.run(trainer(placement, judged=True))
        (tmp_path / "before.html").write_bytes(asyncio.run(get(placement)))
        command = line.split()  # kubectl --kubeconfig <path> get pods -A -o wide
        listed = subprocess.run(
            [str(parts_dir() / "kubectl"), *command[1:]],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("the pages stay served"):
                break
        # after: settled, the pages still served
        after = asyncio.run(trainer(placement, judged=False))
        pages = asyncio.run(looked_at(tmp_path / "before.html", placement, decided))
        out, err = demo.communicate(input="", timeout=120)  # its standard input closed
    finally:
        stopped(demo)
    assert listed.returncode == 0, listed.stderr
    # the trainer evicted from gpu-a's map, outlined with its verdict in words before;
    # its replacement there after, aligned: outlined nowhere
    (old_uid, old), (new_uid, _) = before, after
    assert old_uid != new_uid
    before_dom, after_dom, decisions_dom, asked = pages
    marks = trainer_marks(before_dom, old_uid)
    assert marks and not [m for m in marks if "data-verdict" not in m[1]], marks
    (row,) = [a for t, a in marks if t == "tr"]
    assert all(v["words"] in row["title"] for v in old["verdicts"]) and old["verdicts"]
    marks = trainer_marks(after_dom, new_uid)
    assert marks and not any("data-verdict" in a for a in marks), marks
    assert not trainer_marks(after_dom, old_uid)
    # the decision page: acting, and the trainer's fix held
    found = parsed(decisions_dom).found
    assert [a["data-mode"] for _, a, _ in found if "data-mode" in a] == ["acting"]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", decisions_dom, re.S)
    assert [r for r in rows if "Deployment/team-gpu-a/trainer-remote" in r and ">held<" in r]
    assert asked == []  # the live pages asked for nothing
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

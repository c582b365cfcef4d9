"""What the exporter needs of the node, measured rather than assumed: no capability at
all. It runs here as uid 0 with every capability set emptied and no_new_privs set (what
the DaemonSet's ``capabilities: {drop: [ALL]}`` and ``allowPrivilegeEscalation: false``
give it) and every collector succeeds, on a simulated GPU node (cgroups, NVML's host
PIDs through /proc/<pid>/cgroup, the kubelet's socket, the API server) and on this
machine's real /proc and /sys. uid 0 it needs: the kubelet keeps its socket in a
directory only root may enter, and the kernel lets only root (or the task's owner) move
a task into a resctrl group (components/resctrl-manage)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys

import psutil
import pytest

from numaguard.simulator.cluster.simulated import one_node
from numaguard.simulator.fakes import presets
from numaguard.simulator.parts.processes import exporter_process, get, until
from tests.conftest import samples

pytestmark = pytest.mark.cluster

# root with nothing: every capability set empty, and no way to gain one back
WITHOUT_CAPABILITIES = (
    *(shutil.which("setpriv") or "setpriv", "--bounding-set=-all", "--inh-caps=-all"),
    *("--ambient-caps=-all", "--no-new-privs"),
)
NOBODY = ("--reuid=65534", "--regid=65534", "--clear-groups")


def status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def assert_powerless(pid: int) -> None:
    """The process really runs as root without any capability."""
    got = status(pid)
    assert got["Uid"].split()[1] == "0"  # effective uid
    for capabilities in ("CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(got[capabilities], 16) == 0, capabilities
    assert got["NoNewPrivs"] == "1"


def collectors(exposition: bytes) -> dict[str, float]:
    return {
        dict(labels)["collector"]: value
        for (name, labels), value in samples(exposition).items()
        if name == "numaguard_collector_success"
    }


async def test_every_collector_succeeds_without_a_capability_on_a_gpu_node(control_plane):
    host, nvml = presets.gpu_node()
    async with one_node(control_plane, host, nvml, wrapper=WITHOUT_CAPABILITIES) as (_, url):
        assert_powerless(exporter_pid(url))

        async def named():
            """The kubelet's socket answered and the API server named the pods holding
            devices (its pod and DRA watches synced: a cycle or two after readiness)."""
            exposition = await get(f"{url}/metrics")
            return {"trainer-remote", "dra-job", "infer-a"} <= holders(exposition) and exposition

        exposition = await until(named, "the devices' holders named", timeout=120, every=0.5)
    assert collectors(exposition) == {
        "host_numa": 1,
        "pod_placement": 1,
        "resctrl": 1,
        "gpu": 1,
        "pod_resources": 1,
    }


def holders(exposition: bytes) -> set[str]:
    return {
        dict(labels)["pod"]
        for name, labels in samples(exposition)
        if name == "numaguard_gpu_holder_info"
    }


def exporter_pid(url: str) -> int:
    """The pid of this test's exporter serving at ``url``."""
    listen = url.removeprefix("http://")
    (pid,) = [p.pid for p in psutil.Process().children() if listen in p.cmdline()]
    return pid


async def test_every_collector_succeeds_without_a_capability_on_this_machine():
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "KUBERNETES_SERVICE_HOST")}
    async with exporter_process(env=env, wrapper=WITHOUT_CAPABILITIES) as (url, proc):
        assert_powerless(proc.pid)
        exposition = await get(f"{url}/metrics")
    got = collectors(exposition)
    assert got and set(got.values()) == {1}, got


def test_what_needs_root_is_the_kubelet_s_socket_not_other_users_files(tmp_path):
    """As another user (nobody, still without a capability): other users' processes'
    /proc/<pid>/cgroup, which the exporter reads, stays readable; the kubelet's socket,
    in a directory only root may enter (the kubelet makes it 0750), does not."""
    python = sys._base_executable  # the system's, which any user may run
    sockets = tmp_path / "pod-resources"
    sockets.mkdir(mode=0o750)
    os.chmod(tmp_path, 0o755)
    path = sockets / "kubelet.sock"
    probe = (
        "import socket, sys\n"
        "print(open('/proc/1/cgroup').read().splitlines()[-1])\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        f"    s.connect({str(path)!r})\n"
        "except PermissionError:\n"
        "    sys.exit(13)\n"
    )
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen()
        done = subprocess.run(
            [*WITHOUT_CAPABILITIES, *NOBODY, python, "-I", "-c", probe],
            capture_output=True,
            text=True,
        )
    assert done.returncode == 13, done.stderr  # the socket refused
    assert re.match(r"\d+:[^:]*:/", done.stdout), done.stdout  # /proc/1/cgroup was read

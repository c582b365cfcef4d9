"""A real two-socket kernel under the exporter: the node VM (simulator/parts/vm.py) boots
Debian's kernel with two sockets and two NUMA nodes at distance 21, its root this
machine's file system, and runs tests/test_this_machine.py inside it — the exporter, as
it ships, against the guest kernel's own /sys and /proc, read at the same moment."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from numaguard.simulator.parts import vm
from tests.conftest import samples
from tests.helpers import vm_pods
from tests.helpers.numa_files import numa_maps_bytes, numa_stat_bytes

pytestmark = pytest.mark.vm

SCRIPT = """
for n in /sys/devices/system/node/node[0-9]*; do
  echo "$(basename $n) $(cat $n/cpulist) $(cat $n/distance)"
done > nodes.txt
cd {root}
.venv/bin/python -m pytest -p no:cacheprovider -q tests/test_this_machine.py
"""


@pytest.mark.timeout(1200)
async def test_the_exporter_on_a_two_socket_kernel_matches_its_sysfs(tmp_path):
    root = Path(__file__).resolve().parent.parent
    ran = await vm.run(SCRIPT.format(root=root), tmp_path / "job", timeout=1100)
    assert ran.rc == 0, f"{ran.ended}\n{ran.output[-4000:]}{ran.console[-2000:]}"
    assert "1 passed" in ran.output
    # not vacuous: the guest had two NUMA nodes, two CPUs each, at distance 21
    assert (ran.files / "nodes.txt").read_text() == "node0 0-1 10 21\nnode1 2-3 21 10\n"


PODS_SCRIPT = """
cd {root}
.venv/bin/python tests/helpers/vm_pods.py /mnt
"""


@pytest.fixture(scope="module")
def pods_ran(tmp_path_factory) -> vm.Ran:
    """One boot for the pods' tests: tests/helpers/vm_pods.py's run."""
    root = Path(__file__).resolve().parent.parent
    job = tmp_path_factory.mktemp("pods") / "job"
    ran = asyncio.run(vm.run(PODS_SCRIPT.format(root=root), job, timeout=1100))
    assert ran.rc == 0, f"{ran.ended}\n{ran.output[-4000:]}{ran.console[-2000:]}"
    return ran


@pytest.mark.timeout(1200)
def test_verdicts_from_a_real_kernel_s_numa_accounting(pods_ran):
    """A container whose CPUs sit on node 0 and whose memory the kernel put on node 1 is
    memory_remote; one whose exclusive CPUs span both nodes is cpu_span; their memory per
    NUMA node is what the kernel's memory.numa_stat says, and where /proc/<pid>/numa_maps
    says the touched pages are."""
    ran = pods_ran
    got = samples((ran.files / "metrics.txt").read_bytes())

    def by(name: str, uid: str, label: str) -> dict[str, float]:
        return by_label(got, name, uid, label)

    remote, span = (vm_pods.PODS[n][0] for n in ("remote", "span"))
    assert by("numaguard_pod_cross_numa", remote, "reason") == {
        "cpu_span": 0,
        "memory_remote": 1,
    }
    assert by("numaguard_pod_cross_numa", span, "reason")["cpu_span"] == 1
    assert by("numaguard_pod_exclusive_cpus", remote, "numa_node") == {"0": 1}
    assert by("numaguard_pod_exclusive_cpus", span, "numa_node") == {"0": 1, "1": 1}
    touched = vm_pods.TOUCHED_MIB << 20
    memory = by("numaguard_pod_memory_bytes", remote, "numa_node")
    kernel = numa_stat_bytes((ran.files / "remote.numa_stat").read_text())
    pages = numa_maps_bytes((ran.files / "remote.numa_maps").read_text())
    # where the kernel put the touched memory: node 1, by both of its accounts
    assert pages["1"] >= touched and memory["1"] >= touched
    # and the exporter's figure is the cgroup's, read a moment apart (the process holds
    # still: it touched its memory and waits)
    for node in ("0", "1"):
        assert abs(memory.get(node, 0) - kernel.get(node, 0)) <= 0.02 * kernel["1"], node


@pytest.mark.timeout(1200)
def test_remote_memory_moves_home_in_place_at_the_rate(pods_ran):
    """The remote container's memory, moved by the mover as the exporter's overlay runs it
    (uid 0, one capability): refused with CAP_SYS_NICE alone; with CAP_SYS_PTRACE on
    node 0 afterwards by numa_maps, the same process still running, no faster than the
    rate, and the exporter's next verdict memory_remote 0."""
    files = pods_ran.files
    for cap in ("sys_nice", "sys_ptrace"):  # each run said what it did, and nothing else
        assert (files / f"move.{cap}.stderr").read_text().strip() == "", cap
    refused = json.loads((files / "move.sys_nice.json").read_text())
    assert (refused["stopped"], refused["bytes"]) == ("EACCES", 0)
    moved = json.loads((files / "move.sys_ptrace.json").read_text())
    touched = vm_pods.TOUCHED_MIB << 20
    assert not moved["stopped"] and moved["processes"] == 1
    assert moved["bytes"] >= touched and moved["bytes"] == moved["pages"] * 4096
    assert moved["seconds"] >= moved["bytes"] / vm_pods.MOVE_RATE
    # what stayed, the kernel refused: pages other processes map too (the interpreter's
    # libraries: as many as the page cache put on node 1, 27 to 1,113 pages in our runs);
    # and the far page at the end of its 0.25 TiB reservation, asked about one chunk
    # (scan_limit) instead of all its 64 Mi addresses
    assert set(moved["failures"]) <= {"EACCES", "scan_limit"}, moved["failures"]
    assert moved["failures"]["scan_limit"] == 1
    stayed = 0.02 * touched + moved["failures"].get("EACCES", 0) * 4096
    assert (files / "remote.alive").read_text().strip() == "True"
    before = numa_maps_bytes((files / "remote.numa_maps").read_text())
    after = numa_maps_bytes((files / "remote.after.numa_maps").read_text())
    assert before["1"] >= touched and after["0"] >= touched
    assert after.get("1", 0) <= stayed
    got = samples((files / "metrics.after.txt").read_bytes())
    uid = vm_pods.PODS["remote"][0]
    memory = by_label(got, "numaguard_pod_memory_bytes", uid, "numa_node")
    assert memory["0"] >= touched and memory.get("1", 0) <= stayed
    assert by_label(got, "numaguard_pod_cross_numa", uid, "reason")["memory_remote"] == 0
    # and the cgroup's own account, read just after the move, says so too
    kernel = numa_stat_bytes((files / "remote.after.numa_stat").read_text())
    assert kernel["0"] >= touched and kernel.get("1", 0) <= stayed


def by_label(got, name: str, uid: str, label: str) -> dict[str, float]:
    """A pod's samples of one family, by one label's value (a NUMA node, a reason)."""
    return {dict(k)[label]: v for (n, k), v in got.items() if n == name and ("pod_uid", uid) in k}

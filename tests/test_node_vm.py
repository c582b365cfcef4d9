"""A real two-socket kernel under the exporter: the node VM (simulator/vm.py) boots
Debian's kernel with two sockets and two NUMA nodes at distance 21, its root this
machine's file system, and runs tests/test_this_machine.py inside it — the exporter, as
it ships, against the guest kernel's own /sys and /proc, read at the same moment."""

from __future__ import annotations

from pathlib import Path

import pytest

from numaguard.simulator import vm

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
    assert ran.rc == 0, ran.output[-4000:] + ran.console[-2000:]
    assert "1 passed" in ran.output
    # not vacuous: the guest had two NUMA nodes, two CPUs each, at distance 21
    assert (ran.files / "nodes.txt").read_text() == "node0 0-1 10 21\nnode1 2-3 21 10\n"

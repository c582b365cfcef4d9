"""The node VM's hang detector (pure): QEMU's TCG now and then stops a guest's CPUs for
good; its console then says so, every half minute, or, every CPU stopped, the guest's
heartbeat stops, and the harness boots the node again rather than wait out its timeout."""

from __future__ import annotations

from numaguard.simulator.parts.vm import Heartbeat
from numaguard.simulator.parts.vm_kubelet import HUNG_SECONDS, KubeNode

# what the guest's watchdog printed in one such boot
HUNG = """[   56.487475] rcu: INFO: rcu_preempt self-detected stall on CPU
[   61.283713] watchdog: BUG: soft lockup - CPU#1 stuck for 27s! [kubelet:341]
[  565.286581] watchdog: BUG: soft lockup - CPU#1 stuck for 496s! [kubelet:341]
[  565.752030] watchdog: BUG: soft lockup - CPU#4 stuck for 495s! [kubelet:348]
"""


def test_a_guest_is_hung_only_once_a_cpu_is_stuck_for_minutes(tmp_path):
    node = KubeNode(None, tmp_path)
    assert node._hung() is None  # no console yet
    console = tmp_path / "console.txt"
    console.write_text("[    0.000000] Linux version 6.1.0-57-amd64\n")
    assert node._hung() is None
    # a loaded host starves a guest for a while: not yet hung
    console.write_text(HUNG.splitlines()[1] + "\n")
    assert node._hung() is None
    lines = [f"watchdog: BUG: soft lockup - CPU#0 stuck for {HUNG_SECONDS}s! [sleep:1]"]
    console.write_text("\n".join(lines))
    assert node._hung() == f"the node VM hung: a CPU stuck for {HUNG_SECONDS}s"
    console.write_text(HUNG)
    assert node._hung() == "the node VM hung: a CPU stuck for 496s"


def test_a_guest_is_hung_once_its_heartbeat_is_still_for_minutes(tmp_path):
    """Every CPU stopped, the guest's watchdog prints nothing: its silence says it."""
    now = [0.0]
    beat = Heartbeat(tmp_path, clock=lambda: now[0])
    node = KubeNode(None, tmp_path)
    node.heartbeat = beat
    now[0] = HUNG_SECONDS - 1  # booting: no beat yet, not yet hung
    assert node._hung() is None
    (tmp_path / "alive").write_text("12.5 40.1\n")
    now[0] = 2 * HUNG_SECONDS - 1  # the beat seen late still counts from when it was seen
    assert node._hung() is None
    (tmp_path / "alive").write_text("17.5 50.2\n")
    assert node._hung() is None
    now[0] += HUNG_SECONDS - 1  # the same beat since
    assert node._hung() is None
    now[0] += 1
    assert node._hung() == f"the node VM hung: no heartbeat for {HUNG_SECONDS}s"

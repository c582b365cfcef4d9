"""Readers for what the kernel says of each CPU: its core's threads (SMT) and, from
/proc/stat, how much of its time was busy."""

from __future__ import annotations

from dataclasses import dataclass

from numaguard.exporter.readers import ParseError, _count, _small_int


@dataclass(frozen=True, slots=True)
class CpuTime:
    """A CPU's time since boot, in USER_HZ ticks: busy (all but idle and iowait) and
    all of it."""

    busy: int
    total: int


# /proc/stat's cpuN fields since 2.6.33: user nice system idle iowait irq softirq steal
# guest guest_nice. guest and guest_nice are already counted in user and nice.
_COUNTED = 8
_IDLE, _IOWAIT = 3, 4


def parse_cpu_times(text: str) -> dict[int, CpuTime]:
    """``/proc/stat``: each ``cpuN`` line (the summed ``cpu`` line and the rest of the
    file passed over). Older kernels print fewer fields: at least the first four."""
    out: dict[int, CpuTime] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        cpu = _small_int(name[3:])
        if len(fields) < 4:  # a later kernel may add fields: the first 8 are these
            raise ParseError(f"{name}: {len(fields)} fields, not 4 or more")
        ticks = [_count(f) for f in fields[:_COUNTED]]  # guest time is in user and nice
        idle = ticks[_IDLE] + (ticks[_IOWAIT] if len(ticks) > _IOWAIT else 0)
        if cpu in out:
            raise ParseError(f"{name} twice")
        out[cpu] = CpuTime(sum(ticks) - idle, sum(ticks))
    if not out:
        raise ParseError("no cpuN line")
    return out


def parse_smt_active(text: str) -> bool:
    """``/sys/devices/system/cpu/smt/active``: 1 when some core runs more than one thread."""
    value = text.strip()
    if value not in ("0", "1"):
        raise ParseError(f"smt/active is 0 or 1, not {value[:20]!r}")
    return value == "1"

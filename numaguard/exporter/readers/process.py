"""A process's own files under /proc/<pid>/."""

from __future__ import annotations

from numaguard.exporter.readers import ParseError


def parse_start_time(stat: str) -> int:
    """/proc/<pid>/stat's 22nd field: when the process started, in clock ticks since
    boot. With its PID, what names one process for good (a PID is reused, this is not)."""
    # what follows the command name, which is in parentheses and may hold anything
    _, paren, rest = stat.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 20 or not fields[19].isdigit():
        raise ParseError("no start time in /proc/<pid>/stat")
    return int(fields[19])

"""Readers: the text of one kernel file -> a typed record.

Pure functions, like prometheus/procfs: no I/O, no metrics. Anything they cannot make
sense of raises ParseError; the caller counts it and carries on.
"""

from __future__ import annotations

import functools

# The kernel's NR_CPUS and MAX_NUMNODES are far below this; a larger id is garbage and
# would otherwise let one bad file allocate a huge set.
MAX_ID = 1 << 16


class ParseError(ValueError):
    """The file's text is not what the kernel writes there."""


@functools.lru_cache(maxsize=1024)
def parse_id_list(text: str) -> frozenset[int]:
    """A kernel list such as cpulist or cpuset.cpus: ``0-3,8,10-11``; empty means none.

    Remembered by text (the result is immutable): a node's hundreds of cpusets are a few
    lists that rarely change, the shared pool's above all, and a 224-CPU one costs
    ~13-27 us to parse against ~0.1 to look up."""
    text = text.strip()
    if not text:
        return frozenset()
    ids: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        first = _small_int(lo)
        last = _small_int(hi) if sep else first
        if last < first:
            raise ParseError(f"descending range {part!r}")
        ids.update(range(first, last + 1))
    return frozenset(ids)


def parse_single_int(text: str) -> int:
    """A file that holds one integer, such as physical_package_id or numa_node."""
    text = text.strip()
    try:
        if len(text) > 21:
            raise ValueError
        return int(text)
    except ValueError:
        raise ParseError(f"not an integer: {text[:40]!r}") from None


def parse_key_values(text: str) -> dict[str, int]:
    """Lines of ``key value`` (numastat, vmstat, cpu.stat). Every value must be a count."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2:
            raise ParseError(f"expected 'key value', got {line[:60]!r}")
        out[fields[0]] = _count(fields[1])
    return out


def _small_int(text: str) -> int:
    value = _count(text)
    if value >= MAX_ID:
        raise ParseError(f"id {value} out of range")
    return value


def _count(text: str) -> int:
    # Kernel counters are unsigned 64-bit: at most 20 digits.
    if not text.isascii() or not text.isdigit() or len(text) > 20:
        raise ParseError(f"not a 64-bit count: {text[:40]!r}")
    return int(text)


def format_id_list(ids: frozenset[int]) -> str:
    """The kernel's compact list form of ``ids``: the inverse of parse_id_list."""
    parts = []
    ordered = sorted(ids)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)

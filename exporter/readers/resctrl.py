"""Readers for resctrl monitoring files and the CPU cache topology."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.readers import ParseError, _count

# What a monitoring file may say instead of a number (kernel resctrl docs).
UNREADABLE = {"Unavailable": "unavailable", "Error": "error", "Unassigned": "unassigned"}
_SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_MAX_TID = 1 << 22  # kernel PID_MAX_LIMIT


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A monitoring value the kernel could not give; never a number."""

    reason: str  # unavailable | error | unassigned


MonValues = dict[str, "int | Unreadable"]  # event name -> value
EVENTS = ("llc_occupancy", "mbm_total_bytes", "mbm_local_bytes")


def sum_mon_values(parts: list[MonValues]) -> MonValues:
    """Add places (groups, domains) event by event. An event missing from one place is
    left out; one unreadable in any place is unreadable in the sum."""
    out: MonValues = {}
    for event in EVENTS:
        values = [p.get(event) for p in parts]
        if not values or any(v is None for v in values):
            continue
        bad = next((v for v in values if isinstance(v, Unreadable)), None)
        out[event] = bad if bad is not None else sum(values)
    return out


def parse_mon_value(text: str) -> int | Unreadable:
    """``llc_occupancy``, ``mbm_total_bytes``, ``mbm_local_bytes``: bytes, or a word."""
    text = text.strip()
    if text in UNREADABLE:
        return Unreadable(UNREADABLE[text])
    return _count(text)


def parse_word_list(text: str) -> frozenset[str]:
    """``info/L3_MON/mon_features``: one name per line."""
    words = frozenset(text.split())
    if not all(w.replace("_", "").isalnum() and w.isascii() for w in words):
        raise ParseError("unexpected characters in a list of names")
    return words


def parse_cache_size(text: str) -> int:
    """``cache/indexN/size``: ``32768K``."""
    text = text.strip()
    scale = _SIZE_UNITS.get(text[-1:], 1)
    return _count(text[:-1] if scale > 1 else text) * scale


def parse_tids(text: str) -> frozenset[int]:
    """A resctrl ``tasks`` or a cgroup ``cgroup.threads``/``tasks`` file: one id a line."""
    tids = set()
    for line in text.split():
        tid = _count(line)
        if tid >= _MAX_TID:
            raise ParseError(f"task id {tid} out of range")
        tids.add(tid)
    return frozenset(tids)

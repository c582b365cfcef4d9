"""Readers for resctrl monitoring files and the CPU cache topology."""

from __future__ import annotations

from dataclasses import dataclass

from numaguard.exporter.readers import ParseError, _count

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


def parse_assign_mode(text: str) -> str:
    """``info/L3_MON/mbm_assign_mode``: the modes one a line, the one in effect in
    brackets (``[mbm_event]`` on AMD's assignable counters, else ``[default]``)."""
    for word in text.split():
        if len(word) > 2 and word[0] == "[" and word[-1] == "]":
            return word[1:-1]
    raise ParseError("no mode in brackets")


def parse_domain_counts(text: str) -> dict[int, int]:
    """``info/L3_MON/num_mbm_cntrs`` and ``available_mbm_cntrs``: ``0=32;1=32``."""
    counts = {}
    for part in text.strip().split(";"):
        domain, sep, count = part.partition("=")
        if not sep:
            raise ParseError(f"not domain=count: {part[:40]!r}")
        counts[_count(domain)] = _count(count)
    return counts


def parse_assignments(text: str) -> dict[str, dict[int, bool]]:
    """A group's ``mbm_L3_assignments``: per MBM event, per L3 domain, whether a counter
    is assigned (``mbm_total_bytes:0=e;1=_``, one event a line; ``_`` is none)."""
    out: dict[str, dict[int, bool]] = {}
    for line in text.split():
        event, sep, states = line.partition(":")
        if not sep or not event.replace("_", "").isalnum():
            raise ParseError(f"not event:domain=state: {line[:40]!r}")
        out[event] = {}
        for part in states.split(";"):
            domain, sep, state = part.partition("=")
            if not sep or len(state) != 1:
                raise ParseError(f"not domain=state: {part[:40]!r}")
            out[event][_count(domain)] = state != "_"
    return out


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

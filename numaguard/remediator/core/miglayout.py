"""MIG layouts (pure): which slices fit on one GPU, a layout that gives the slices
sizing wants, and the GPU Operator's MIG manager configs (mig-parted's ``version: v1``)
read and written.

Placement is the MIG user guide's: on a GPU of 8 memory slices (A100 on) a 1g of one
slice starts at 0-6, a 1g of two at an even slice, a 2g at 0, 2 or 4, a 3g at 0 or 4, a
4g and a 7g at 0; on one of 4 (A30, RTX PRO 6000) a slice starts at a multiple of its
size. The slices' compute adds up to at most the GPU's (7, or 4). A ``+me`` slice takes
the GPU's one set of media extensions: one a GPU. Other variants (``+gfx``, ``-me``,
``+me.all``) have rules not modelled here: never laid out, and a config holding one is
not judged."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from numaguard.remediator.core.mig import FAMILIES, Family, _split, geometry

# where a slice of (compute, memory slices) may start on a GPU of 8 memory slices
_STARTS_OF_8 = {
    (1, 1): range(7),
    (1, 2): range(0, 8, 2),
    (2, 2): range(0, 6, 2),
    (3, 4): (0, 4),
    (4, 4): (0,),
    (7, 8): (0,),
}
# a label value: what nvidia.com/mig.config may hold
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
PREFIX = "numaguard-"  # of the configs numaguard recommends


def family_named(model: str) -> Family | None:
    """The family of a GPU named ``model`` (nvmlDeviceGetName, or GPU Feature Discovery's
    ``nvidia.com/gpu.product``, whose spaces are dashes)."""
    return next((f for f in FAMILIES if f.models.search(model)), None)


@dataclass(frozen=True)
class Slot:
    compute: int
    size: int  # memory slices
    starts: tuple[int, ...]
    media: bool  # holds the GPU's media extensions


def shape(family: Family) -> tuple[int, int] | None:
    """(compute slices, memory slices) of a whole GPU of ``family``, as its largest
    profile says (7 and 8, or 4 and 4); None for any other."""
    plain = [p for p in family.profiles if _split(p)[2] in ("", "+me")]
    unit = min(geometry(p)[1] for p in plain)
    compute, memory = geometry(max(plain, key=geometry))
    whole = (compute, round(memory / unit))
    return whole if whole in ((7, 8), (4, 4)) else None


def slots(family: Family) -> dict[str, Slot] | None:
    """Each laid-out profile's slot; None for a family of another shape."""
    if shape(family) is None:
        return None
    _, total = shape(family)
    plain = [p for p in family.profiles if _split(p)[2] in ("", "+me")]
    unit = min(geometry(p)[1] for p in plain)
    out = {}
    for p in plain:
        c, m = geometry(p)
        size = round(m / unit)
        if total == 8:
            starts = tuple(_STARTS_OF_8.get((c, size), ()))
        else:
            starts = tuple(range(0, total - size + 1, size))
        if starts:
            out[p] = Slot(c, size, starts, _split(p)[2] == "+me")
    return out


def fits(family: Family, layout: Mapping[str, int]) -> bool:
    """Whether one GPU of ``family`` takes these slices together."""
    table = slots(family)
    if table is None or any(p not in table for p, n in layout.items() if n):
        return False
    wanted = sorted((table[p] for p, n in layout.items() for _ in range(n)), key=lambda s: -s.size)
    compute, memory = shape(family)
    if sum(s.compute for s in wanted) > compute or sum(s.media for s in wanted) > 1:
        return False

    def place(i: int, taken: int) -> bool:
        if i == len(wanted):
            return True
        slot = wanted[i]
        for start in slot.starts:
            mask = ((1 << slot.size) - 1) << start
            if start + slot.size <= memory and not taken & mask and place(i + 1, taken | mask):
                return True
        return False

    return place(0, 0)


def layout_for(family: Family, want: Mapping[str, int]) -> dict[str, int]:
    """One GPU's layout holding as many of the wanted slices as fit, the largest first,
    the rest of the GPU in its smallest plain slices; {} when none of them fits."""
    table = slots(family) or {}
    chosen: Counter[str] = Counter()
    for profile in sorted((p for p in want if p in table), key=geometry, reverse=True):
        while chosen[profile] < want[profile] and fits(family, chosen + Counter({profile: 1})):
            chosen[profile] += 1
    if not chosen:
        return {}
    smallest = min((p for p in table if not table[p].media), key=geometry)
    while fits(family, chosen + Counter({smallest: 1})):
        chosen[smallest] += 1
    return dict(sorted(chosen.items(), key=lambda kv: geometry(kv[0]), reverse=True))


def config_name(layout: Mapping[str, int]) -> str:
    """The name (and ``nvidia.com/mig.config`` value) of a config laying out every GPU
    so: numaguard-1x3g.40gb-4x1g.10gb, hashed where that passes a label value's 63."""
    name = PREFIX + "-".join(f"{n}x{p}" for p, n in layout.items())
    if len(name) > 63 or not _LABEL_VALUE.fullmatch(name):
        name = PREFIX + hashlib.sha256(name.encode()).hexdigest()[:16]
    return name


def mig_parted(name: str, layout: Mapping[str, int]) -> dict:
    """The MIG manager's config (the ConfigMap's config.yaml) laying out all GPUs so."""
    entry = {"devices": "all", "mig-enabled": True, "mig-devices": dict(layout)}
    return {"version": "v1", "mig-configs": {name: [entry]}}


@dataclass(frozen=True)
class Entry:
    """One entry of a mig-parted config: the GPUs it lays out and how."""

    devices: tuple[int, ...] | None  # None: all
    layout: dict[str, int]  # {}: MIG off
    judged: bool  # False: a device filter or key this module does not evaluate


def parse_configs(text: str) -> dict[str, tuple[Entry, ...]]:
    """The configs of a mig-parted ``version: v1`` document; ValueError, saying where,
    when it is not one."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"not YAML: {err}") from None
    if not isinstance(doc, dict) or doc.get("version") != "v1":
        raise ValueError("not a mig-parted config: version must be v1")
    configs = doc.get("mig-configs")
    if not isinstance(configs, dict):
        raise ValueError("mig-configs must be a mapping of config names")
    out = {}
    for name, entries in configs.items():
        if not isinstance(name, str) or not _LABEL_VALUE.fullmatch(name) or len(name) > 63:
            raise ValueError(f"config {name!r}: not a label value")
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"config {name}: must be a list of entries")
        out[name] = tuple(_entry(name, e) for e in entries)
    return out


def _entry(name: str, entry) -> Entry:
    if not isinstance(entry, dict) or not isinstance(entry.get("mig-enabled"), bool):
        raise ValueError(f"config {name}: each entry needs mig-enabled: true or false")
    devices = entry.get("devices")
    if devices == "all":
        picked = None
    elif isinstance(devices, list) and all(type(d) is int and d >= 0 for d in devices):
        picked = tuple(devices)
    else:
        raise ValueError(f"config {name}: devices must be all or a list of GPU indexes")
    layout = (entry.get("mig-devices") or {}) if entry["mig-enabled"] else {}
    if not isinstance(layout, dict) or not all(
        isinstance(p, str) and type(n) is int and n >= 0 for p, n in layout.items()
    ):
        raise ValueError(f"config {name}: mig-devices must map profiles to counts")
    known = set(entry) <= {"devices", "mig-enabled", "mig-devices"}
    return Entry(picked, {p: n for p, n in layout.items() if n}, known)


def per_gpu(entries: tuple[Entry, ...], gpus: int) -> list[dict[str, int]] | None:
    """Each of a node's ``gpus`` GPUs' layout under a config (a later entry over an
    earlier one, as the MIG manager applies them); None when it cannot be judged."""
    out: list[dict[str, int] | None] = [None] * gpus
    for entry in entries:
        picked = range(gpus) if entry.devices is None else entry.devices
        if not entry.judged or any(i >= gpus for i in picked):
            return None
        for i in picked:
            out[i] = entry.layout
    return [layout or {} for layout in out]


def served(family: Family, layouts: list[dict[str, int]], want: Mapping[str, int]) -> int | None:
    """How many of the wanted slices a node's GPUs laid out so hold; None when some
    GPU's layout does not fit it (the MIG manager would fail)."""
    if not all(fits(family, layout) for layout in layouts if layout):
        return None
    total: Counter[str] = Counter()
    for layout in layouts:
        total.update(layout)
    return sum(min(total[p], n) for p, n in want.items())

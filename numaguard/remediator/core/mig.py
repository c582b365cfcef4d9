"""MIG profiles per GPU family, for sizing (pure).

A profile's name says its compute (``3g``: three of the GPU's compute slices) and memory
(``40gb``), but the same name means different things on different GPUs: ``1g.10gb`` is
the largest 1g on an A100-40GB and the smallest on an A100-80GB, ``1g.35gb`` is H200's 1g
with two memory slices and GB300's smallest. So a slice is sized within its GPU's family,
known by the GPU's model (``numaguard_gpu_info``); by the profile's name alone only where
the model is not known and that name belongs to one family. A GPU named but not in the
tables is not sized at all.

The tables are NVIDIA's supported-profile tables of the MIG user guide (and the
``mig-parted`` default configuration), smallest first. Variants keep their engines: a
``+me`` slice (with media extensions) is only ever sized among ``+me`` profiles, a plain
one among plain ones; a suffix here not yet known sizes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PROFILE = re.compile(r"(\d+)g\.(\d+)gb(.*)")


@dataclass(frozen=True)
class Family:
    name: str
    models: re.Pattern  # nvmlDeviceGetName of its GPUs
    profiles: tuple[str, ...]

    def sizes(self, profile: str) -> list[str]:
        """The family's profiles with the same engines as ``profile``, smallest first."""
        variant = _split(profile)[2]
        return sorted((p for p in self.profiles if _split(p)[2] == variant), key=geometry)


def _family(name: str, models: str, *profiles: str) -> Family:
    return Family(name, re.compile(models, re.IGNORECASE), profiles)


def _seven(g1: int, g1x2: int, g3: int, g7: int) -> tuple[str, ...]:
    """The profiles of a GPU with 7 compute and 8 memory slices (A100 to Blackwell):
    1g with one memory slice (and with media extensions), 1g with two, 2g, 3g, 4g, 7g."""
    return (
        f"1g.{g1}gb",
        f"1g.{g1}gb+me",
        f"1g.{g1x2}gb",
        f"2g.{g1x2}gb",
        f"3g.{g3}gb",
        f"4g.{g3}gb",
        f"7g.{g7}gb",
    )


FAMILIES = (
    _family("A30-24GB", r"\bA30\b", "1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"),
    _family("A100-40GB", r"\bA[18]00\b.*\b40GB\b", *_seven(5, 10, 20, 40)),
    _family(
        "A100/H100-80GB",
        r"\b[AH][18]00\b.*\b80GB\b|\bH100 PCIe\b|\bH100 SXM5?\b",
        *_seven(10, 20, 40, 80),
    ),
    _family("H100-94GB", r"\bH[18]00 NVL\b", *_seven(12, 24, 47, 94), "1g.24gb+me"),
    _family(
        "H100/GH200-96GB",
        r"\bH100\b.*\b96GB\b|\bGH200 480GB\b|\bGH200 96GB\b|\bH20\b|\bPG506\b",
        *_seven(12, 24, 48, 96),
        "1g.24gb+me",
    ),
    _family("H200-141GB", r"\bH200\b", *_seven(18, 35, 71, 141)),
    _family("GH200-144GB", r"\bGH200 144G", *_seven(18, 36, 72, 144)),
    _family("B200-180GB", r"\bB200\b", *_seven(23, 45, 90, 180)),
    _family("GB200-186GB", r"\bGB200\b", *_seven(23, 47, 93, 186)),
    _family("B300-269GB", r"\bB300\b", *_seven(34, 67, 135, 269)),
    _family("GB300-278GB", r"\bGB300\b", *_seven(35, 70, 139, 278)),
    _family(
        "RTX PRO 6000 Blackwell",
        r"\bRTX PRO 6000 Blackwell\b",
        *(f"{g}g.{24 * g}gb{v}" for g in (1, 2) for v in ("", "+gfx", "+me.all", "-me")),
        "4g.96gb",
        "4g.96gb+gfx",
    ),
)


def family_of(model: str, profile: str) -> Family | None:
    """The family of a slice of ``profile`` on a GPU named ``model``; None when that
    family lacks the profile or no family has that model (a GPU without a table here).
    Without a model (no ``numaguard_gpu_info`` for the GPU), the one family that has the
    profile, if only one has it."""
    if model:
        family = next((f for f in FAMILIES if f.models.search(model)), None)
        return family if family is not None and profile in family.profiles else None
    having = [f for f in FAMILIES if profile in f.profiles]
    return having[0] if len(having) == 1 else None


def geometry(profile: str) -> tuple[int, int]:
    """(compute slices, memory GB) as the name says."""
    compute, memory, _ = _split(profile)
    return compute, memory


def _split(profile: str) -> tuple[int, int, str]:
    m = _PROFILE.fullmatch(profile)
    if m is None:
        raise ValueError(f"not a MIG profile: {profile!r}")
    return int(m[1]), int(m[2]), m[3]

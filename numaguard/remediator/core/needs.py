"""What a pod must find in one NUMA zone to run aligned (pure): its exclusive CPUs, its
memory, its devices, and how many of its GPUs must be joined well enough for P2P."""

from __future__ import annotations

from dataclasses import dataclass

from numaguard.contract.reasons import FREE_SET_SIZES, P2P_UP_TO


@dataclass
class Need:
    cpus: float
    memory: float
    devices: dict[str, int]
    joined: int = 0  # full GPUs that must be a free set joined at P2P_UP_TO or better

    def describe(self) -> str:
        devices = ", ".join(f"{n} {r}" for r, n in sorted(self.devices.items()))
        joined = f" joined at {P2P_UP_TO} or better" if self.joined else ""
        return f"{self.cpus:g} exclusive CPUs, {self.memory / 2**30:.1f} GiB" + (
            f", {devices}{joined}" if devices else ""
        )


def set_size(gpus: int) -> int | None:
    """The smallest free-set size the exporters report that holds ``gpus`` (a set of 4
    joined at a level holds 3 joined as well); None: more than any."""
    return next((size for size in FREE_SET_SIZES if size >= gpus), None)

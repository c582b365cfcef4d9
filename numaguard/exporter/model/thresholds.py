"""Where the model's verdicts are decided: when a pod's memory counts as remote, and
when a GPU counts as starved by its host (the reasons, and their default thresholds, are
the contract's: contract/reasons.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from numaguard.contract.reasons import STARVED_THRESHOLDS

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When a pod's memory counts as remote (verdict ``memory_remote``), and when a GPU is
    starved by its host: low utilization while one of the host signals is high."""

    memory_remote_ratio: float = 0.3
    memory_remote_min_bytes: int = 64 * MIB
    gpu_starved_utilization: float = 0.3  # SM (else graphics) activity below this is low
    # reason -> the share of its measure at or above which it starves a barely busy GPU
    # (those not given keep their defaults)
    starved: Mapping[str, float] = field(default_factory=lambda: STARVED_THRESHOLDS)

    def __post_init__(self) -> None:
        unknown = set(self.starved) - set(STARVED_THRESHOLDS)
        if unknown:
            raise ValueError(f"no starved reason decided by a threshold: {sorted(unknown)}")
        merged = MappingProxyType({**STARVED_THRESHOLDS, **self.starved})
        object.__setattr__(self, "starved", merged)  # frozen: set once, here

"""The GPUs and driver branches the fake NVML serves: each model's MIG profiles and
placements as NVIDIA's MIG user guide lists them, and what each driver branch's
libnvidia-ml exports."""

from __future__ import annotations

from dataclasses import dataclass

import pynvml as N


@dataclass(frozen=True)
class Profile:
    name: str  # as the device plugin names it: 1g.10gb
    id: int  # NVML's GPU instance profile id
    memory_slices: int  # of 8
    sm_count: int
    memory_mib: int
    placements: tuple[int, ...]  # the memory slices a GPU instance of it may start at

    @property
    def index(self) -> int:
        """NVML's NVML_GPU_INSTANCE_PROFILE_* for it (what nvmlDeviceGetGpuInstanceProfileInfoV
        takes): by compute slices; a 1g with two memory slices is 1_SLICE_REV2."""
        compute = int(self.name.split("g.")[0])
        if compute == 1 and self.memory_slices == 2:
            return N.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
        return {
            1: N.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
            2: N.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
            3: N.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
            4: N.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
            7: N.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
        }[compute]


@dataclass(frozen=True)
class Model:
    name: str  # nvmlDeviceGetName
    sm_count: int
    memory_mib: int
    gpm: bool  # Hopper and later
    profiles: tuple[Profile, ...]

    def profile(self, name: str) -> Profile:
        for p in self.profiles:
            if p.name == name:
                return p
        raise ValueError(f"{self.name} has no MIG profile {name}")


# Where a GPU instance may start, by its memory slices, on the 8-slice GPUs below (the MIG
# user guide's placement tables; nvmlDeviceGetGpuInstancePossiblePlacements_v2): a 1g of
# one slice anywhere but the last, of two on even slices, a 2g on 0, 2 or 4, a 3g on 0 or
# 4, a 4g and a 7g on 0 only.
_STARTS = {(1, 1): range(7), (1, 2): range(0, 8, 2), (2, 2): range(0, 6, 2), (3, 4): (0, 4)}


def _profiles(*rows: tuple[str, int, int, int, int]) -> tuple[Profile, ...]:
    def starts(name: str, memory_slices: int) -> tuple[int, ...]:
        return tuple(_STARTS.get((int(name.split("g.")[0]), memory_slices), (0,)))

    return tuple(Profile(*row, starts(row[0], row[2])) for row in rows)


# Geometry per docs/design.md (Signals); SM counts as the drivers report them.
MODELS = {
    "A100-40GB": Model(
        "NVIDIA A100-SXM4-40GB",
        108,
        40960,
        False,
        _profiles(
            ("1g.5gb", 19, 1, 14, 4864),
            ("2g.10gb", 14, 2, 28, 9984),
            ("3g.20gb", 9, 4, 42, 20096),
            ("4g.20gb", 5, 4, 56, 20096),
            ("7g.40gb", 0, 8, 98, 40192),
        ),
    ),
    "H100-80GB": Model(
        "NVIDIA H100 80GB HBM3",
        132,
        81559,
        True,
        _profiles(
            ("1g.10gb", 19, 1, 16, 9856),
            ("1g.20gb", 15, 2, 16, 19968),
            ("2g.20gb", 14, 2, 32, 19968),
            ("3g.40gb", 9, 4, 60, 40192),
            ("4g.40gb", 5, 4, 64, 40192),
            ("7g.80gb", 0, 8, 132, 80384),
        ),
    ),
    "H200-141GB": Model(
        "NVIDIA H200",
        132,
        143771,
        True,
        _profiles(
            ("1g.18gb", 19, 1, 16, 16384),
            ("1g.35gb", 15, 2, 16, 32768),
            ("2g.35gb", 14, 2, 32, 32768),
            ("3g.71gb", 9, 4, 60, 65536),
            ("4g.71gb", 5, 4, 64, 65536),
            ("7g.141gb", 0, 8, 132, 130560),
        ),
    ),
}


@dataclass(frozen=True)
class DriverBranch:
    """What one driver branch's ``libnvidia-ml.so`` serves: its versions, and the C
    symbols of those this fake implements that it does not export (from ``nvml.h`` of
    the CUDA release the branch shipped with). A missing symbol fails as on a real
    library: pynvml raises FunctionNotFound, or NVMLLibraryMismatchError for an
    unversioned wrapper."""

    name: str
    driver_version: str  # nvmlSystemGetDriverVersion
    nvml_version: str  # nvmlSystemGetNVMLVersion: CUDA major, then the driver version
    lacks: frozenset[str] = frozenset()


_BY_ID = "nvmlDeviceGetGpuInstanceProfileInfoByIdV"  # NVML 13.0 (R580) on
_NUMA_NODE = "nvmlDeviceGetNumaNodeId"  # NVML 12.4 (R550) on
BRANCHES = {
    b.name: b
    for b in (
        DriverBranch("R525", "525.147.05", "12.525.147.05", frozenset({_BY_ID, _NUMA_NODE})),
        DriverBranch("R535", "535.261.03", "12.535.261.03", frozenset({_BY_ID, _NUMA_NODE})),
        DriverBranch("R550", "550.163.01", "12.550.163.01", frozenset({_BY_ID})),
        DriverBranch("R570", "570.172.08", "12.570.172.08", frozenset({_BY_ID})),
        DriverBranch("R580", "580.95.05", "13.580.95.05"),
    )
}

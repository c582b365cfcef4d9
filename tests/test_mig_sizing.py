"""MIG sizing per GPU family: the same profile name sized by its GPU's own table, a
slice's engines kept, and no guess where the family cannot be known."""

from __future__ import annotations

import pytest

from numaguard.contract.names import mig_resource
from numaguard.remediator.core.findings import Detection, sizing_findings
from numaguard.remediator.core.mig import FAMILIES, family_of, geometry
from numaguard.simulator.parts.prometheus import as_signals

GIB = 1 << 30
NOW = 1_800_000_000.0


def sized(model: str, profile: str, sm: float, memory_gib: float) -> list[tuple[str, str]]:
    """(kind, recommended) for one slice of ``profile`` on a GPU named ``model`` ("": no
    numaguard_gpu_info for it) whose pod used ``sm`` of it and ``memory_gib`` at most."""
    ids = {"node": "n1", "mig_uuid": "MIG-1", "mig_profile": profile}
    ids |= {"gpu": "0", "gpu_uuid": "GPU-1"}
    total = geometry(profile)[1] * 1e9
    holder = {
        "node": "n1",
        "mig_uuid": "MIG-1",
        "gpu": "0",
        "gpu_uuid": "GPU-1",
        "namespace": "ml",
        "pod": "p",
        "pod_uid": "uid-p",
        "container": "main",
        "resource": mig_resource(profile),
        "source": "kubelet",
        "value": 1.0,
    }
    frames = {
        "slice_sm": [{**ids, "value": sm}],
        "slice_sm_peak": [{**ids, "value": sm}],
        "slice_memory_peak": [{**ids, "value": memory_gib * GIB}],
        "slice_memory_total": [{**ids, "value": total}],
        "holders": [holder],
        "gpu_models": [],
    }
    if model:
        frames["gpu_models"].append(
            {"node": "n1", "gpu": "0", "gpu_uuid": "GPU-1", "model": model, "value": 1.0}
        )
    signals = as_signals(NOW, frames, {"n1": "10.0.0.1:9400"})
    return [(f.kind, f.recommended) for f in sizing_findings(signals, Detection())]


# (GPU name as NVML gives it, slice, SM activity, memory used GiB) -> what to use instead
CASES = {
    "A30-24GB": [
        ("NVIDIA A30", "4g.24gb", 0.1, 4, ("oversized", "1g.6gb")),
        ("NVIDIA A30", "1g.6gb", 0.95, 2, ("undersized", "2g.12gb")),
    ],
    "A100-40GB": [
        # the largest 1g here: more compute is a 2g of the same memory
        ("NVIDIA A100-SXM4-40GB", "1g.10gb", 0.95, 2, ("undersized", "2g.10gb")),
        ("NVIDIA A100-PCIE-40GB", "1g.10gb", 0.1, 2, ("oversized", "1g.5gb")),
    ],
    "A100/H100-80GB": [
        # the same 1g.10gb is the smallest here
        ("NVIDIA A100-SXM4-80GB", "1g.10gb", 0.95, 2, ("undersized", "2g.20gb")),
        ("NVIDIA H100 80GB HBM3", "7g.80gb", 0.2, 12, ("oversized", "2g.20gb")),
        # 30 GiB used, plus headroom, needs more than 40 GB: no smaller profile fits
        ("NVIDIA H100 PCIe", "3g.40gb", 0.2, 30, ("oversized", "3g.40gb")),
    ],
    "H100-94GB": [
        ("NVIDIA H100 NVL", "3g.47gb", 0.1, 8, ("oversized", "1g.12gb")),
    ],
    "H100/GH200-96GB": [
        # memory full on a 3g: the next with more memory and no less compute is the 7g
        ("NVIDIA GH200 480GB", "3g.48gb", 0.5, 46, ("undersized", "7g.96gb")),
    ],
    "H200-141GB": [
        ("NVIDIA H200", "1g.18gb", 0.5, 17.5, ("undersized", "1g.35gb")),
        ("NVIDIA H200 NVL", "1g.35gb", 0.95, 10, ("undersized", "2g.35gb")),
    ],
    "GH200-144GB": [
        ("NVIDIA GH200 144G HBM3e", "2g.36gb", 0.1, 5, ("oversized", "1g.18gb")),
    ],
    "B200-180GB": [
        ("NVIDIA B200", "1g.23gb", 0.95, 5, ("undersized", "2g.45gb")),
    ],
    "GB200-186GB": [
        ("NVIDIA GB200", "3g.93gb", 0.1, 30, ("oversized", "1g.47gb")),
    ],
    "B300-269GB": [
        ("NVIDIA B300 SXM6 AC", "7g.269gb", 0.1, 20, ("oversized", "1g.34gb")),
    ],
    "GB300-278GB": [
        # the same 1g.35gb is H200's two-memory-slice 1g: here it is the smallest
        ("NVIDIA GB300", "1g.35gb", 0.95, 10, ("undersized", "2g.70gb")),
    ],
    "RTX PRO 6000 Blackwell": [
        # four compute slices; a slice without media engines stays without them
        (
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "2g.48gb-me",
            0.1,
            4,
            ("oversized", "1g.24gb-me"),
        ),
        (
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "4g.96gb+gfx",
            0.1,
            4,
            ("oversized", "1g.24gb+gfx"),
        ),
        (
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "1g.24gb",
            0.95,
            4,
            ("undersized", "2g.48gb"),
        ),
    ],
}


def test_every_family_has_cases():
    assert set(CASES) == {f.name for f in FAMILIES}


@pytest.mark.parametrize(
    "model,profile,sm,memory,expected",
    [case for cases in CASES.values() for case in cases],
    ids=[f"{name}:{c[1]}" for name, cases in CASES.items() for c in cases],
)
def test_a_slice_is_sized_by_its_gpus_table(model, profile, sm, memory, expected):
    found = sized(model, profile, sm, memory)
    _, recommended = expected
    if recommended == profile:  # it fits where it is
        assert found == []
    else:
        assert found == [expected]
        assert family_of(model, recommended) is family_of(model, profile)


def test_each_model_names_one_family():
    names = [c[0] for cases in CASES.values() for c in cases]
    for name in names:
        assert sum(bool(f.models.search(name)) for f in FAMILIES) == 1, name


def test_media_extensions_are_kept_or_nothing_is_said():
    # H100's only +me profile is the 1g: saturated, nothing larger keeps the engines
    assert sized("NVIDIA H100 80GB HBM3", "1g.10gb+me", 0.95, 2) == []
    assert family_of("NVIDIA H100 80GB HBM3", "1g.10gb+me").sizes("1g.10gb+me") == ["1g.10gb+me"]


def test_without_the_model_only_a_name_of_one_family_is_sized():
    # 3g.40gb is A100/H100-80GB's alone
    assert sized("", "3g.40gb", 0.1, 6) == [("oversized", "1g.10gb")]
    # 1g.10gb is A100-40GB's largest 1g and A100-80GB's smallest: no guess
    assert sized("", "1g.10gb", 0.95, 2) == []
    # a GPU we have no table for, or a profile its table lacks: no guess either
    assert sized("NVIDIA L40S", "3g.40gb", 0.1, 6) == []
    assert sized("NVIDIA H200", "3g.40gb", 0.1, 6) == []
    assert sized("NVIDIA H100 80GB HBM3", "1g.10gb+xyz", 0.1, 1) == []


def test_mig_resource_names_follow_the_device_plugin():
    assert mig_resource("1g.10gb") == "nvidia.com/mig-1g.10gb"
    assert mig_resource("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"
    assert mig_resource("1g.24gb+me.all") == "nvidia.com/mig-1g.24gb.me.all"
    assert mig_resource("1g.24gb-me") == "nvidia.com/mig-1g.24gb-me"

"""DRA's partitionable devices (KEP-4815) as NVIDIA's DynamicMIG publishes them: counter
sets read from complete pools only, what allocated claims consume, how many more slices
of each MIG profile fit (against a search over the MIG user guide's placements), the
cross-check with NVML's GPU instances, and what the exporter says of them."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numaguard.exporter.collection import Collection
from numaguard.exporter.model.counters import SEARCH_STEPS, counter_states
from numaguard.exporter.model.devices import DeviceFinder
from numaguard.exporter.model.zones import dra_devices
from numaguard.exporter.readers.dra import (
    Allocated,
    DraDevice,
    DraView,
    dra_view,
    read_resource_slice,
)
from numaguard.exporter.records import UNSUPPORTED, GpuReading, GpuRecord, SliceRecord
from numaguard.exporter.sources.gpu import NvmlSource
from numaguard.simulator.fakes import dra, presets
from numaguard.simulator.fakes.gpu_models import MODELS, Profile
from numaguard.simulator.fakes.nvml import FakeNvml
from tests.conftest import NODE, examples, samples
from tests.helpers.dra_shapes import dra_fixture

pytestmark = pytest.mark.pure

SET = "gpu-0-counter-set"


def h100s(count: int = 1) -> FakeNvml:
    """H100s with MIG on and no instance made yet, as DynamicMIG leaves them."""
    nvml = FakeNvml(clock=lambda: 0.0)
    for i in range(count):
        nvml.add_gpu("H100-80GB", i % 2, mig=[])
    return nvml


def record(nvml: FakeNvml, index: int) -> GpuRecord:
    """What the GPU source reads of a fake GPU, as far as counters care."""
    g = nvml.gpus[index]
    slices = tuple(
        SliceRecord(
            s.uuid,
            s.profile.name,
            s.gi_id,
            0,
            s.profile.sm_count,
            s.placement_start,
            s.profile.memory_slices,
            None,
            None,
            UNSUPPORTED,
            0,
            (),
        )
        for s in g.mig or []
    )
    mig = g.mig is not None
    return GpuRecord(index, g.uuid, g.model.name, "", g.numa_node, True, "", mig, slices=slices)


def claimed(*devices: str, pool: str = NODE) -> dict:
    return {
        ("ml", f"claim-{i}"): (Allocated("mig", dra.DRIVER, pool, d),)
        for i, d in enumerate(devices)
    }


def states(nvml: FakeNvml, allocations=None, unknown: int = 0, **published):
    view = dra.view(NODE, nvml, list(range(len(nvml.gpus))), allocations, dynamic=True, **published)
    view = replace(view, claims_unknown=unknown)
    return counter_states(view, {g.uuid: record(nvml, i) for i, g in enumerate(nvml.gpus)})


def test_counters_are_read_from_complete_pools_only():
    nvml = h100s(2)
    slices = [read_resource_slice(s) for s in dra.resource_slices(NODE, nvml, [0, 1], dynamic=True)]
    assert [s.slice_count for s in slices] == [3, 3, 3]  # the counters' slice and one a GPU
    full = dra_view(slices, {})
    assert sorted(full.counter_sets) == [
        (dra.DRIVER, NODE, "gpu-0-counter-set"),
        (dra.DRIVER, NODE, "gpu-1-counter-set"),
    ]
    assert dra_view(slices[:2], {}).counter_sets == {}  # a slice still to come
    # the driver republishes as generation 2: the old generation's slices do not count
    newer = [replace(s, generation=2) for s in slices[1:]]
    assert dra_view([*slices, *newer], {}).counter_sets == {}
    assert (
        dra_view([*slices, *newer, replace(slices[0], generation=2)], {}).counter_sets
        == full.counter_sets
    )
    # one set defined twice, or a counter consumed that no set defines: a broken pool
    twice = replace(slices[1], counter_sets=slices[0].counter_sets)
    assert dra_view([slices[0], twice, slices[2]], {}).counter_sets == {}
    (gpu0, *rest) = slices[1].devices
    odd = replace(gpu0, consumes={SET: {**gpu0.consumes[SET], "tensor-cores": 1}})
    assert (
        dra_view([slices[0], replace(slices[1], devices=(odd, *rest)), slices[2]], {}).counter_sets
        == {}
    )
    assert states(h100s(2)) and states(h100s(2), split=False) == states(h100s(2))


def test_the_fake_driver_publishes_what_the_driver_code_does():
    """The fake's DynamicMIG devices for an H100 read as the shapes in tests/helpers/dra/ (drawn
    from the driver's code): same names, profiles, placements and memory slices."""
    nvml = h100s()
    fake = {
        d.name: d
        for s in dra.resource_slices("n1", nvml, [0], dynamic=True)
        for d in read_resource_slice(s).devices
    }
    counters, devices = map(read_resource_slice, dra_fixture("v25.12-dynamic.yaml"))
    ours = read_resource_slice(dra.resource_slices("n1", nvml, [0], dynamic=True)[0])
    assert set(ours.counter_sets[SET]) == set(counters.counter_sets[SET])  # the driver's names
    for shaped in devices.devices:
        ours = fake[shaped.name]
        assert (ours.profile, ours.placement) == (shaped.profile, shaped.placement)
        slices = {k for k in ours.consumes[SET] if k.startswith("memory-slice")}
        assert slices == {k for k in shaped.consumes[SET] if k.startswith("memory-slice")}
        assert ours.consumes[SET]["multiprocessors"] == shaped.consumes[SET]["multiprocessors"]
    # and every placement the MIG user guide lists for an H100, no more
    placements = [
        *(f"1g10gb-19-{s}" for s in range(7)),
        *(f"1g20gb-15-{s}" for s in (0, 2, 4, 6)),
        *(f"2g20gb-14-{s}" for s in (0, 2, 4)),
        *(f"3g40gb-9-{s}" for s in (0, 4)),
        "4g40gb-5-0",
        "7g80gb-0-0",
    ]
    assert sorted(fake) == sorted(["gpu-0", *(f"gpu-0-mig-{p}" for p in placements)])


# -- an oracle of its own: placements and budgets from the MIG user guide's tables ----


def fits(profile: Profile, start: int, used: set[int], sms: int, mib: int, model) -> bool:
    largest = max(model.profiles, key=lambda p: p.memory_slices)
    mine = set(range(start, start + profile.memory_slices))
    return (
        not mine & used
        and sms + profile.sm_count <= largest.sm_count
        and mib + profile.memory_mib <= largest.memory_mib
    )


def most(profile: Profile, used: set[int], sms: int, mib: int, model) -> int:
    """How many more of ``profile`` fit, by trying every set of its placements."""
    largest = max(model.profiles, key=lambda p: p.memory_slices)
    starts = [s for s in profile.placements if fits(profile, s, used, sms, mib, model)]
    for k in range(len(starts), 0, -1):
        for chosen in itertools.combinations(starts, k):
            spans = [set(range(s, s + profile.memory_slices)) for s in chosen]
            disjoint = sum(map(len, spans)) == len(set().union(*spans))
            room = sms + k * profile.sm_count <= largest.sm_count
            room &= mib + k * profile.memory_mib <= largest.memory_mib
            if disjoint and room:
                return k
    return 0


@settings(max_examples=examples(120), deadline=None)
@given(picks=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 6)), max_size=8))
def test_free_profiles_are_what_a_search_over_the_placements_finds(picks):
    """After any allocations the scheduler could make, the counters never go negative and
    each profile's free count is what a search over its placements finds."""
    nvml = h100s()
    model = MODELS["H100-80GB"]
    used: set[int] = set()
    sms = mib = 0
    names = []
    for p, s in picks:
        profile = model.profiles[p]
        start = profile.placements[s % len(profile.placements)]
        if fits(profile, start, used, sms, mib, model):
            names.append(dra.mig_name(0, profile, start))
            used |= set(range(start, start + profile.memory_slices))
            sms, mib = sms + profile.sm_count, mib + profile.memory_mib
    (state,) = states(nvml, claimed(*names))
    assert all(state.capacity[k] - v >= 0 for k, v in state.consumed.items())
    assert state.consumed["multiprocessors"] == sms
    assert state.consumed["memory"] == mib * 2**20
    assert state.profiles_free == {p.name: most(p, used, sms, mib, model) for p in model.profiles}
    assert state.profiles_max == {p.name: most(p, set(), 0, 0, model) for p in model.profiles}


def test_unread_claims_say_nothing_of_what_is_consumed():
    nvml = h100s()
    (state,) = states(nvml, unknown=1)
    assert state.capacity["memory-slice-7"] == 1
    assert (state.consumed, state.profiles_free, state.mismatches) == (None, None, None)
    # a claim allocated a device the pool no longer names: unknown as well
    (state,) = states(nvml, claimed("gpu-0-mig-1g10gb-19-9"))
    assert (state.consumed, state.profiles_free) == (None, None)


def test_claims_and_gpu_instances_are_cross_checked():
    nvml = h100s()
    two = dra.mig_name(0, MODELS["H100-80GB"].profile("2g.20gb"), 2)
    (state,) = states(nvml, claimed(two))
    assert state.mismatches == {"claimed_without_instance": 2, "instance_without_claim": 0}
    nvml.make_slice(0, "2g.20gb", 2)  # the driver prepared the claim
    (state,) = states(nvml, claimed(two))
    assert state.mismatches == {"claimed_without_instance": 0, "instance_without_claim": 0}
    assert state.gpu_uuid == nvml.gpus[0].uuid
    nvml.make_slice(0, "1g.10gb", 6)  # made outside DRA
    (state,) = states(nvml, claimed(two))
    assert state.mismatches == {"claimed_without_instance": 0, "instance_without_claim": 1}
    # the whole GPU claimed: no MIG instance is owed
    (state,) = states(h100s(), claimed("gpu-0"))
    assert state.mismatches == {"claimed_without_instance": 0, "instance_without_claim": 0}
    assert set(state.profiles_free.values()) == {0}


def test_a_search_past_its_budget_is_unknown_not_a_guess():
    """Forged devices: 40 placements of one profile each taking one of 20 counts. The
    search gives up (unknown) rather than stall a cycle."""
    devices = {
        (dra.DRIVER, NODE, f"d{i}"): DraDevice(
            dra.DRIVER,
            NODE,
            f"d{i}",
            "",
            "GPU-x",
            (0, 1),
            "1g.1gb",
            {"s": {"count": 1, f"c{i}": 1}},
        )
        for i in range(40)
    }
    capacity = {"count": 20} | {f"c{i}": 1 for i in range(40)}
    view = DraView(devices, {}, {(dra.DRIVER, NODE, "s"): capacity})
    (state,) = counter_states(view, {})
    assert state.profiles_free is None and state.profiles_max == {}
    assert SEARCH_STEPS < 2**20


def test_each_gpu_s_counters_and_free_profiles_are_exported(fake_root):
    """Through the exporter: GPU 7 of the preset node under DynamicMIG, a 3g.40gb of it
    claimed and made."""
    clock = iter(range(1000, 10**6, 15))
    host, nvml = presets.gpu_node()
    nvml.set_mig(7, [])
    made = nvml.make_slice(7, "3g.40gb", 4)
    taken = dra.mig_name(7, made.profile, 4)
    view = dra.view(NODE, nvml, [7], claimed(taken), dynamic=True)
    root = fake_root(host)
    with nvml.installed():
        source = NvmlSource(pynvml, str(root.root), 5.0, lambda: next(clock))
        source.start()
        try:
            collection = Collection(
                NODE, {"gpu": source}, clock=lambda: next(clock), dra=lambda: view
            )
            asyncio.run(collection.run_once())
            got = samples(collection.exposition.text)
        finally:
            source.close()
    gpu = nvml.gpus[7]
    ids = {
        "node": NODE,
        "driver": dra.DRIVER,
        "counter_set": "gpu-7-counter-set",
        "gpu_uuid": gpu.uuid,
    }

    def value(name, **labels):
        return got[(name, frozenset((ids | labels).items()))]

    assert value("numaguard_dra_counter", counter="multiprocessors", state="capacity") == 132
    assert value("numaguard_dra_counter", counter="multiprocessors", state="consumed") == 60
    assert value("numaguard_dra_counter", counter="memory", state="consumed") == 40192 * 2**20
    # the memory slices' own counters only with --detail
    assert not any(dict(k[1]).get("counter", "").startswith("memory-slice") for k in got)
    # slices 0-3 left: a 4g.40gb, or two 2g.20gb, or four 1g.10gb; no 7g, no second 3g
    free = {
        dict(k[1])["mig_profile"]: v
        for k, v in got.items()
        if k[0] == "numaguard_gpu_mig_profiles_free"
    }
    assert free == {
        "1g.10gb": 4,
        "1g.20gb": 2,
        "2g.20gb": 2,
        "3g.40gb": 1,
        "4g.40gb": 1,
        "7g.80gb": 0,
    }
    assert value("numaguard_dra_counter_mismatch_slices", kind="claimed_without_instance") == 0
    series = sum(
        1 for k in got if k[0].startswith(("numaguard_dra_", "numaguard_gpu_mig_profiles"))
    )
    # 7 counters (multiprocessors, memory, 5 engines) twice, 6 profiles, 2 mismatch kinds
    assert series == 2 * 7 + 6 + 2  # what one GPU's DynamicMIG adds to the bill


def test_zones_count_partitions_from_counters():
    nvml = h100s(2)
    gpus = {g.uuid: record(nvml, i) for i, g in enumerate(nvml.gpus)}
    half = dra.mig_name(0, MODELS["H100-80GB"].profile("4g.40gb"), 0)
    reading = GpuReading(tuple(gpus.values()))
    known = [(0, dra.DRIVER, 7, 3), (1, dra.DRIVER, 7, 7)]  # 1g.10gb: 7 a GPU, 3 left beside a 4g
    unknown = [(0, dra.DRIVER, 7, None), (1, dra.DRIVER, 7, None)]
    for claims_unknown, expected in ((0, known), (1, unknown)):
        view = dra.view(NODE, nvml, [0, 1], claimed(half), dynamic=True)
        view = replace(view, claims_unknown=claims_unknown)
        assert dra_devices(DeviceFinder(reading, view), (), counter_states(view, gpus)) == expected

"""Readers on real kernel text, and on anything else hypothesis can think of: a reader
either returns a record or raises ParseError, never anything else."""

from __future__ import annotations

import contextlib
import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numaguard.exporter.readers import (
    ParseError,
    format_id_list,
    parse_id_list,
    parse_key_values,
    parse_single_int,
)
from numaguard.exporter.readers.cgroup import (
    CpuThrottling,
    Pressure,
    parse_cpu_throttling,
    parse_numa_stat_v1,
    parse_numa_stat_v2,
    parse_pressure,
    parse_proc_cgroup,
)
from numaguard.exporter.readers.cpu import parse_cpu_times, parse_smt_active
from numaguard.exporter.readers.dra import (
    Allocated,
    device_plugin_id,
    parse_quantity,
    read_claim_allocation,
    read_resource_slice,
)
from numaguard.exporter.readers.kubeletconfig import CpuManager, parse_kubelet_config
from numaguard.exporter.readers.numa import (
    NodeMeminfo,
    parse_distance,
    parse_node_meminfo,
    parse_numastat,
    parse_vmstat_balancing,
)
from numaguard.exporter.readers.nvml import (
    counter_rates,
    gpm_values,
    nvlink_counters,
    parse_profile_name,
    sysfs_pci_address,
)
from numaguard.exporter.readers.process import parse_start_time
from numaguard.exporter.readers.resctrl import (
    parse_assign_mode,
    parse_assignments,
    parse_cache_size,
    parse_domain_counts,
    parse_mon_value,
    parse_tids,
    parse_word_list,
)
from tests.conftest import examples
from tests.helpers.dra_shapes import dra_fixture

NUMA_STAT_V2 = """anon N0=1048576 N1=4096
file N0=524288 N1=0
kernel_stack N0=16384 N1=0
shmem N0=0 N1=0
"""
NUMA_STAT_V1 = """total=11914 N0=11000 N1=914
file=9235 N0=9000 N1=235
anon=374 N0=300 N1=74
unevictable=2305 N0=1700 N1=605
hierarchical_total=327569 N0=327000 N1=569
hierarchical_file=324469 N0=324000 N1=469
hierarchical_anon=795 N0=700 N1=95
hierarchical_unevictable=2305 N0=2300 N1=5
"""
NODE_MEMINFO = """Node 1 MemTotal:       32768000 kB
Node 1 MemFree:        16384000 kB
Node 1 MemUsed:        16384000 kB
Node 1 Active:           105920 kB
Node 1 HugePages_Total:     0
"""


def test_id_lists_round_trip():
    assert parse_id_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_id_list("\n") == frozenset()
    assert format_id_list(frozenset({0, 1, 2, 3, 8, 10, 11})) == "0-3,8,10-11"
    for bad in ("3-1", "a", "1,,2", "-1", "0-70000", "1-"):
        with pytest.raises(ParseError):
            parse_id_list(bad)


def test_node_files():
    assert parse_node_meminfo(NODE_MEMINFO) == NodeMeminfo(
        32768000 * 1024, 16384000 * 1024, 16384000 * 1024
    )
    assert parse_distance("10 21 31\n") == (10, 21, 31)
    assert parse_numastat(
        "numa_hit 5\nnuma_miss 0\nnuma_foreign 1\ninterleave_hit 2\nlocal_node 4\nother_node 1\n"
    ) == {
        "numa_hit": 5,
        "numa_miss": 0,
        "numa_foreign": 1,
        "interleave_hit": 2,
        "local_node": 4,
        "other_node": 1,
    }
    assert parse_single_int("1\n") == 1
    assert parse_single_int("-1\n") == -1  # PCI numa_node: unknown


def test_vmstat_balancing_only_when_present():
    text = (
        "nr_free_pages 12\nnuma_hint_faults 10\nnuma_hint_faults_local 7\nnuma_pages_migrated 2\n"
    )
    assert parse_vmstat_balancing(text) == {
        "numa_hint_faults": 10,
        "numa_hint_faults_local": 7,
        "numa_pages_migrated": 2,
    }
    assert parse_vmstat_balancing("nr_free_pages 12\nnuma_hit 4\n") == {}
    # lines we do not use may hold anything
    assert parse_vmstat_balancing("weird line here\nnuma_hint_faults 1\n") == {
        "numa_hint_faults": 1
    }


def test_cgroup_files():
    assert parse_numa_stat_v2(NUMA_STAT_V2) == {0: 1048576 + 524288, 1: 4096}
    assert parse_numa_stat_v1(NUMA_STAT_V1, 4096) == {0: 327000 * 4096, 1: 569 * 4096}
    assert parse_numa_stat_v1("total=3 N0=2 N1=1\nfile=0 N0=0 N1=0\n", 4096) == {0: 8192, 1: 4096}
    v2 = "usage_usec 10\nnr_periods 100\nnr_throttled 7\nthrottled_usec 2500000\nnr_bursts 0\n"
    assert parse_cpu_throttling(v2) == CpuThrottling(100, 7, 2.5)
    v1 = "nr_periods 100\nnr_throttled 7\nthrottled_time 1500000000\n"
    assert parse_cpu_throttling(v1) == CpuThrottling(100, 7, 1.5)
    assert parse_cpu_throttling("usage_usec 10\nuser_usec 5\nsystem_usec 5\n") is None
    psi = (
        "some avg10=0.10 avg60=0.00 avg300=0.00 total=1500000\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=250000\n"
    )
    assert parse_pressure(psi) == Pressure(1.5, 0.25)
    assert parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n") == Pressure(
        7e-6, None
    )


@pytest.mark.parametrize(
    "reader, text",
    [
        (parse_node_meminfo, "Node 0 MemTotal: 10 kB\n"),  # no MemFree
        (parse_node_meminfo, "Node 0 MemTotal: 10 kB\nNode 0 MemFree: 20 kB\n"),  # free > total
        (parse_numastat, "numa_hit 5\n"),
        (parse_numastat, "local_node x\nother_node 1\n"),
        (parse_numa_stat_v2, "anon N0=1\n"),
        (parse_numa_stat_v2, "anon N0=1 Nx=2\nfile N0=1\n"),
        (parse_numa_stat_v2, "anon N0=-1\nfile N0=1\n"),
        (lambda t: parse_numa_stat_v1(t, 4096), "file=1 N0=1\n"),
        (parse_cpu_throttling, "nr_periods 1\nnr_throttled 1\n"),
        (parse_cpu_throttling, "nr_periods 1 2\n"),
        (parse_pressure, "full avg10=0 total=1\n"),
        (parse_pressure, "some avg10=0.00 total=abc\n"),
        (parse_distance, ""),
        (parse_single_int, "zero"),
        (parse_key_values, "a 1 2\n"),
    ],
)
def test_garbage_is_a_parse_error(reader, text):
    with pytest.raises(ParseError):
        reader(text)


UID = "0f4b3a1e-9c2d-4e5f-8a6b-7c8d9e0f1a2b"
CID = "ab" * 32
PROC_CGROUP_V2 = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
)
PROC_CGROUP_V1 = (
    f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
    f"11:cpuset:/kubepods/besteffort/pod{UID}/{CID}\n"
    "1:name=systemd:/system.slice/containerd.service\n"
)


def test_proc_cgroup_names_the_pod_container():
    assert parse_proc_cgroup(PROC_CGROUP_V2) == (UID, CID)
    assert parse_proc_cgroup(PROC_CGROUP_V1) == (UID, CID)
    guaranteed = f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n"
    assert parse_proc_cgroup(guaranteed) == (UID, CID)
    assert parse_proc_cgroup("0::/system.slice/sshd.service\n") is None
    assert parse_proc_cgroup("0::/\n") is None  # a cgroup namespace hides it: unknown
    with pytest.raises(ParseError):
        parse_proc_cgroup("garbage\n")


def test_nvml_answers():
    assert parse_profile_name(b"MIG 1g.10gb") == "1g.10gb"
    assert parse_profile_name("MIG 1g.10gb+me") == "1g.10gb+me"
    assert parse_profile_name("MIG 7g.141gb") == "7g.141gb"
    # every variant NVIDIA's MIG user guide and mig-parted's default configuration name
    variants = ("1g.24gb-me", "1g.24gb+gfx", "1g.24gb+me.all", "2g.48gb+me.all", "4g.96gb+gfx")
    for name in (*variants, "1g.6gb+me", "2g.12gb+me", "7g.269gb", "3g.139gb"):
        assert parse_profile_name(f"MIG {name}") == name
    assert sysfs_pci_address(b"00000000:1B:00.0") == "0000:1b:00.0"
    assert sysfs_pci_address("0000:c1:00.0") == "0000:c1:00.0"
    for bad in ("", "MIG", "1g", "MIG 1g.10gb junk", "MIG 1g.10gb+", "MIG 1g.10gb-+"):
        with pytest.raises(ParseError):
            parse_profile_name(bad)
    for bad in ("", "00000000:1B:00", "0:1:2.3", "zzzz:1b:00.0"):
        with pytest.raises(ParseError):
            sysfs_pci_address(bad)
    utilization, supported, pcie, _, nvlink_supported = gpm_values(
        {2: (0, 50.0), 1: (0, 100.0), 3: (3, 0.0), 5: (0, 0.0), 20: (0, 2.0), 21: (3, 0.0)}
    )
    assert utilization == {"sm": 0.5, "graphics": 1.0, "tensor": 0.0}
    assert supported == {
        "sm": True,
        "graphics": True,
        "sm_occupancy": False,
        "tensor": True,
        "dram_bandwidth": False,  # not answered at all
    }
    assert pcie == {"tx": 2.0 * (1 << 20)}
    assert nvlink_supported is False  # GPM gave no NVLink metric
    *_, nvlink, nvlink_supported = gpm_values({60: (0, 1.0), 61: (0, 2.0)})
    assert (nvlink, nvlink_supported) == ({"rx": 1 << 20, "tx": 2 << 20}, True)
    for bad in ({2: (0, 101.0)}, {2: (0, -1.0)}, {2: (0, float("nan"))}, {20: (0, -5.0)}):
        with pytest.raises(ParseError):
            gpm_values(bad)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([1, 2, 3, 5, 10, 20, 21, 99]),
        st.tuples(st.integers(-1, 999), st.floats(allow_nan=True, allow_infinity=True)),
    )
)
def test_any_gpm_answer_is_a_value_in_range_or_a_parse_error(answers):
    try:
        utilization, _, pcie, nvlink, _ = gpm_values(answers)
    except ParseError:
        return
    assert all(0 <= v <= 1 for v in utilization.values())
    assert all(0 <= v < float("inf") for v in (*pcie.values(), *nvlink.values()))


def test_nvlink_throughput_counters():
    ull = 3  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    before = nvlink_counters([(138, 0, ull, 1000, 5_000_000), (139, 0, ull, 10, 5_000_000)])
    assert before == {"tx": (1000, 5_000_000), "rx": (10, 5_000_000)}
    # a field that did not answer is left out; another field is no NVLink counter
    assert nvlink_counters([(138, 3, 0, 0, 0), (140, 0, ull, 1, 1)]) == {}
    after = {"tx": (3048, 7_000_000), "rx": (5, 7_000_000)}  # rx went back: reloaded
    assert counter_rates(before, after) == {"tx": 2048 * 1024 / 2.0}
    assert counter_rates({}, after) == {}  # a first reading: no interval yet
    assert counter_rates(after, after) == {}  # the time did not move
    for bad in ([(138, 0, 1, 5, 1)], [(139, 0, ull, 5, 0)]):  # not a counter; no time
        with pytest.raises(ParseError):
            nvlink_counters(bad)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([138, 139, 140]),
            st.integers(-1, 999),
            st.integers(0, 7),
            st.integers(0, 2**64 - 1),
            st.integers(-(2**63), 2**63 - 1),
        ),
        max_size=4,
    ),
    st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63 - 1)), max_size=2),
)
def test_any_field_answer_is_a_counter_or_a_parse_error(answers, earlier):
    try:
        counters = nvlink_counters(answers)
    except ParseError:
        return
    assert set(counters) <= {"tx", "rx"}
    before = dict(zip(("tx", "rx"), earlier, strict=False))
    assert all(0 <= r < float("inf") for r in counter_rates(before, counters).values())


READERS = [
    parse_id_list,
    parse_single_int,
    parse_key_values,
    parse_distance,
    parse_node_meminfo,
    parse_numastat,
    parse_vmstat_balancing,
    parse_numa_stat_v2,
    lambda t: parse_numa_stat_v1(t, 4096),
    parse_cpu_throttling,
    parse_pressure,
    parse_proc_cgroup,
    parse_profile_name,
    sysfs_pci_address,
    parse_mon_value,
    parse_word_list,
    parse_tids,
    parse_cache_size,
    parse_assign_mode,
    parse_domain_counts,
    parse_assignments,
    parse_kubelet_config,
    parse_start_time,
    parse_cpu_times,
    parse_smt_active,
]
VALID = [
    "0-3,8",
    "1",
    "a 1\nb 2\n",
    "10 21",
    NODE_MEMINFO,
    "local_node 4\nother_node 1\n",
    "numa_hint_faults 3\n",
    NUMA_STAT_V2,
    NUMA_STAT_V1,
    "nr_periods 1\nnr_throttled 0\nthrottled_usec 0\n",
    "some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n",
    PROC_CGROUP_V2,
    "MIG 2g.20gb",
    "00000000:18:00.0",
    "1234\n",
    "llc_occupancy\nmbm_total_bytes\n",
    "1\n2\n",
    "32768K\n",
    "[mbm_event]\ndefault\n",
    "0=32;1=32\n",
    "mbm_total_bytes:0=e;1=_\nmbm_local_bytes:0=e;1=e\n",
    "kind: KubeletConfiguration\ntopologyManagerPolicy: restricted\n",
    "4242 (a (b) c) S 1 4242 4242 0 -1 4194560" + " 0" * 12 + " 987654" + " 0" * 30,
    "cpu  2 0 0 8 0 0 0 0 0 0\ncpu0 2 0 0 8 0 0 0 0 0 0\nintr 1\n",
    "1\n",
    'cpuManagerPolicy: static\ncpuManagerPolicyOptions:\n  full-pcpus-only: "true"\n',
]


def test_a_process_s_start_time_follows_its_name_whatever_the_name_holds():
    stat = "7 (evil) 1 2 3) S 1 7 7 0 -1 4194560" + " 0" * 12 + " 31337" + " 0" * 30
    assert parse_start_time(stat) == 31337
    for bad in ("", "7 (main) S 1", "7 (main" + " 0" * 40):
        with pytest.raises(ParseError):
            parse_start_time(bad)


def topology_manager(text: str) -> tuple[str, str]:
    config = parse_kubelet_config(text)
    return config.topology_policy, config.topology_scope


def cpu_manager(text: str) -> CpuManager:
    return parse_kubelet_config(text).cpu_manager


def test_the_kubelet_s_topology_manager_as_its_config_says_or_its_defaults():
    config = "kind: KubeletConfiguration\ntopologyManagerPolicy: single-numa-node\n"
    assert topology_manager(config) == ("single-numa-node", "container")
    assert topology_manager(config + "topologyManagerScope: pod\n") == ("single-numa-node", "pod")
    assert topology_manager("") == ("none", "container")
    for bad in ("- a\n- b\n", "topologyManagerPolicy: [a]\n", "a: [\n"):
        with pytest.raises(ParseError):
            topology_manager(bad)


def test_the_kubelet_s_cpu_manager_as_its_config_says_or_its_defaults():
    config = (
        'cpuManagerPolicy: static\nreservedSystemCPUs: "0,56"\n'
        'cpuManagerPolicyOptions:\n  full-pcpus-only: "true"\n'
    )
    assert cpu_manager(config) == CpuManager(
        "static", {"full-pcpus-only": "true"}, frozenset({0, 56})
    )
    assert cpu_manager("") == CpuManager("none", {}, None)
    for bad in (
        "cpuManagerPolicyOptions:\n  full-pcpus-only: true\n",  # the kubelet refuses a bool
        "cpuManagerPolicyOptions: [a]\n",
        "cpuManagerPolicy: 3\n",
        "reservedSystemCPUs: 0\n",
        'reservedSystemCPUs: "3-1"\n',
    ):
        with pytest.raises(ParseError):
            cpu_manager(bad)


def test_abmc_files_read_as_the_kernel_writes_them():
    assert parse_assign_mode("[mbm_event]\ndefault\n") == "mbm_event"
    assert parse_assign_mode("mbm_event\n[default]\n") == "default"
    assert parse_domain_counts("0=32;1=30\n") == {0: 32, 1: 30}
    assert parse_assignments("mbm_total_bytes:0=e;1=_\nmbm_local_bytes:0=_;1=e\n") == {
        "mbm_total_bytes": {0: True, 1: False},
        "mbm_local_bytes": {0: False, 1: True},
    }
    for bad in ("mbm_event\ndefault\n", ""):
        with pytest.raises(ParseError):
            parse_assign_mode(bad)
    for bad in ("0:32", "0=", "=3", "0=-1"):
        with pytest.raises(ParseError):
            parse_domain_counts(bad)
    for bad in ("mbm_total_bytes", "mbm_total_bytes:0=ee", "x y:0=e", "mbm_total_bytes:a=e"):
        with pytest.raises(ParseError):
            parse_assignments(bad)


def _mangled(valid: str):
    """Valid text cut short, with bytes flipped, repeated or with junk spliced in."""
    return st.one_of(
        st.integers(0, len(valid)).map(lambda n: valid[:n]),
        st.tuples(st.integers(0, len(valid)), st.text(max_size=20)).map(
            lambda t: valid[: t[0]] + t[1] + valid[t[0] :]
        ),
        st.integers(1, 2000).map(lambda n: valid * n),
    )


@pytest.mark.parametrize("index", range(len(READERS)))
@settings(max_examples=examples(150), deadline=None)
@given(data=st.data())
def test_readers_never_raise_anything_but_parse_error(index, data):
    reader, valid = READERS[index], VALID[index]
    text = data.draw(st.one_of(st.text(), _mangled(valid), st.just(""), st.just("9" * 5000)))
    with contextlib.suppress(ParseError):
        reader(text)


@pytest.mark.parametrize("index", range(len(READERS)))
def test_valid_samples_parse(index):
    assert READERS[index](VALID[index]) is not None


def test_resource_slices_of_every_served_version_read_alike():
    share = {"multiprocessors": {"value": "60"}, "memory-slice-4": {"value": "1"}}
    consumes = [{"counterSet": "gpu-0-counter-set", "counters": share}]
    device = {"name": "gpu-0-mig-9-4-4", "attributes": {"uuid": {"string": "MIG-a"}}}
    device["attributes"]["gpu.nvidia.com/parentUUID"] = {"string": "GPU-p"}  # qualified
    device["consumesCounters"] = consumes
    pool = {"name": "n1", "generation": 2, "resourceSliceCount": 1}
    v1 = {"spec": {"driver": "gpu.nvidia.com", "pool": pool, "devices": [device]}}
    basic = {"attributes": device["attributes"], "consumesCounters": consumes}
    v1beta1 = {"spec": {**v1["spec"], "devices": [{"name": device["name"], "basic": basic}]}}
    for obj in (v1, v1beta1):
        published = read_resource_slice(obj)
        assert (published.pool, published.generation, published.slice_count) == ("n1", 2, 1)
        (d,) = published.devices
        assert (d.driver, d.pool, d.name, d.uuid, d.parent_uuid) == (
            "gpu.nvidia.com",
            "n1",
            "gpu-0-mig-9-4-4",
            "MIG-a",
            "GPU-p",
        )
        assert d.placement == (4, 4)
        assert d.consumes == {"gpu-0-counter-set": {"multiprocessors": 60, "memory-slice-4": 1}}
    (d,) = read_resource_slice({"spec": {**v1["spec"], "devices": [{"name": "gpu-3"}]}}).devices
    assert (d.uuid, d.placement, d.profile) == ("", None, "")  # says nothing: nothing made up
    too_many = {f"c{i}": {"value": "1"} for i in range(33)}  # the API server's limit is 32
    for bad in (
        {},
        {"spec": {"driver": "x", "pool": {}}},
        {"spec": {**v1["spec"], "pool": {"name": "n1", "generation": 1}}},  # no slice count
        {"spec": {**v1["spec"], "devices": [1]}},
        {"spec": {**v1["spec"], "sharedCounters": [{"name": "s", "counters": too_many}]}},
        {"spec": {**v1["spec"], "sharedCounters": [{"name": "s", "counters": {}}]}},
        {"spec": {**v1["spec"], "sharedCounters": [{"name": "s"}] * 2}},
        {"spec": {**v1["spec"], "devices": [{**device, "consumesCounters": consumes * 2}]}},
        {
            "spec": {
                **v1["spec"],
                "devices": [
                    {
                        **device,
                        "consumesCounters": [
                            {"counterSet": "s", "counters": {"m": {"value": "1.5"}}}
                        ],
                    }
                ],
            }
        },
    ):
        with pytest.raises(ParseError):
            read_resource_slice(bad)


def test_both_driver_generations_name_their_mig_placements():
    (static,) = map(read_resource_slice, dra_fixture("v25.8-static.yaml"))
    assert {d.name: (d.placement, d.profile) for d in static.devices} == {
        "gpu-1": (None, ""),
        "gpu-0-mig-9-4-4": ((4, 4), "3g.40gb"),
        "gpu-0-mig-19-0-1": ((0, 1), "1g.10gb"),
    }
    assert (static.generation, static.counter_sets) == (3, {})
    counters, devices = map(read_resource_slice, dra_fixture("v25.12-dynamic.yaml"))
    assert counters.devices == () and devices.counter_sets == {}
    (gpu0,) = counters.counter_sets.items()
    assert gpu0[0] == "gpu-0-counter-set"
    assert gpu0[1]["memory"] == 80384 * 2**20 and gpu0[1]["encoders"] == 0
    assert sorted(k for k in gpu0[1] if k.startswith("memory-slice")) == [
        f"memory-slice-{i}" for i in range(8)
    ]
    by_name = {d.name: d for d in devices.devices}
    assert {n: (d.placement, d.profile) for n, d in by_name.items()} == {
        "gpu-0": (None, ""),
        "gpu-0-mig-1g10gb-19-0": ((0, 1), "1g.10gb"),
        "gpu-0-mig-1g10gb-19-6": ((6, 1), "1g.10gb"),
        "gpu-0-mig-2g20gb-14-2": ((2, 2), "2g.20gb"),
        "gpu-0-mig-3g40gb-9-4": ((4, 4), "3g.40gb"),
        "gpu-0-mig-7g80gb-0-0": ((0, 8), "7g.80gb"),
    }
    # made or not: only the made one has a UUID, each names its GPU
    assert [n for n, d in by_name.items() if d.uuid] == ["gpu-0", "gpu-0-mig-1g10gb-19-0"]
    assert {d.parent_uuid for n, d in by_name.items() if n != "gpu-0"} == {by_name["gpu-0"].uuid}


def test_a_placement_whose_memory_slices_do_not_add_up_has_no_size():
    def device(slices):
        counters = {f"memory-slice-{i}": {"value": "1"} for i in slices}
        return {
            "name": "gpu-0-mig-2g20gb-14-2",
            "consumesCounters": [{"counterSet": "s", "counters": counters}],
        }

    pool = {"name": "n1", "generation": 1, "resourceSliceCount": 1}
    for slices, placement in (([2, 3], (2, 2)), ([3, 4], (2, None)), ([2, 4], (2, None))):
        spec = {"driver": "d", "pool": pool, "devices": [device(slices)]}
        assert read_resource_slice({"spec": spec}).devices[0].placement == placement


@settings(max_examples=examples(120), deadline=None)
@given(data=st.data())
def test_any_change_to_a_published_slice_is_read_or_a_parse_error(data):
    """Any value anywhere in the shapes the driver publishes: a record or ParseError."""
    obj = copy.deepcopy(
        data.draw(
            st.sampled_from(dra_fixture("v25.12-dynamic.yaml") + dra_fixture("v25.8-static.yaml"))
        )
    )
    junk = st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.floats(),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=6,
    )
    for _ in range(data.draw(st.integers(1, 3))):
        at = obj  # down to some value, replaced
        while True:
            key = data.draw(st.sampled_from(list(at) if isinstance(at, dict) else range(len(at))))
            child = at[key]
            if not isinstance(child, (dict, list)) or not child or data.draw(st.booleans()):
                at[key] = data.draw(junk)
                break
            at = child
    with contextlib.suppress(ParseError):
        read_resource_slice(obj)


@settings(max_examples=examples(400), deadline=None)
@given(
    number=st.from_regex(r"[+-]?([0-9]{1,6}(\.[0-9]{0,3})?|\.[0-9]{1,3})", fullmatch=True),
    suffix=st.sampled_from(
        ["", "Ki", "Mi", "Gi", "Ti", "k", "M", "G", "m", "u", "n", "e3", "E2", "e-2"]
    ),
)
def test_quantities_read_as_the_client_library_reads_them(number, suffix):
    from kubernetes.utils import parse_quantity as theirs

    text = number + suffix
    expected = theirs(text)
    if expected == int(expected) and abs(expected) < 2**63:
        assert parse_quantity(text) == int(expected)
    else:
        with pytest.raises(ParseError):
            parse_quantity(text)


def test_claim_allocations_and_device_plugin_ids():
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-1"}
    claim = {"status": {"allocation": {"devices": {"results": [result]}}}}
    assert read_claim_allocation(claim) == (Allocated("gpu", "gpu.nvidia.com", "n1", "gpu-1"),)
    assert read_claim_allocation({"status": {}}) is None  # not allocated yet
    with pytest.raises(ParseError):
        read_claim_allocation({"status": {"allocation": {"devices": {"results": [{}]}}}})
    assert device_plugin_id("GPU-abc::3") == ("GPU-abc", None, None)
    assert device_plugin_id("nvidia2") == ("nvidia2", 2, None)
    assert device_plugin_id("nvidia2/gi7") == ("nvidia2/gi7", 2, 7)
    assert device_plugin_id("MIG-x") == ("MIG-x", None, None)

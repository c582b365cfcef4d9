"""MIG layouts and the MIG manager's re-layout of a node (pure): the product's placement
tables against the fake NVML's (the MIG user guide's), the layout that serves the
slices sizing wants, mig-parted's config read and written, and each step of a re-layout
— never on a node with GPU pods, uncordoned only on the manager's success, a failed or
wedged one left cordoned and blocking the next."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from numaguard.contract.names import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL
from numaguard.remediator.core import miglayout as ml
from numaguard.remediator.core.relayout import (
    MigLayout,
    MigNode,
    Relayout,
    best_config,
    recommend,
    steps,
)
from numaguard.simulator.fakes.gpu_models import MODELS
from numaguard.simulator.fakes.nvml.records import lay_out_slices

H100 = ml.family_named("NVIDIA-H100-80GB-HBM3")
SETTINGS = MigLayout(mode="relabel", node_selector="pool=mig", pending_timeout_seconds=600)
CONFIGS = ml.parse_configs(
    """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  all-3g.40gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
  h200-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}
  filtered-3g:
    - device-filter: ["0x233010DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
"""
)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_placement_tables_are_the_mig_user_guide_s(model):
    gpu = MODELS[model]
    family = ml.family_named(gpu.name)
    table = ml.slots(family)
    for profile in gpu.profiles:
        assert table[profile.name].size == profile.memory_slices, profile.name
        assert table[profile.name].starts == profile.placements, profile.name


@given(st.lists(st.sampled_from(MODELS["H100-80GB"].profiles), max_size=9))
def test_what_fits_is_what_nvml_would_place(profiles):
    layout: dict[str, int] = {}
    for p in profiles:
        layout[p.name] = layout.get(p.name, 0) + 1
    biggest_first = sorted(profiles, key=lambda p: -p.memory_slices)
    assert ml.fits(H100, layout) == (lay_out_slices(biggest_first, set()) is not None)


def test_a_layout_holds_the_wanted_slices_and_fills_the_rest():
    assert ml.layout_for(H100, {"3g.40gb": 1}) == {"3g.40gb": 1, "1g.10gb": 4}
    assert ml.layout_for(H100, {"3g.40gb": 5}) == {"3g.40gb": 2}
    assert ml.layout_for(H100, {"2g.20gb": 5, "1g.20gb": 1}) == {"2g.20gb": 3, "1g.20gb": 1}
    assert ml.layout_for(H100, {"2g.20gb": 2}) == {"2g.20gb": 2, "1g.10gb": 3}
    assert ml.layout_for(H100, {"7g.80gb": 1, "4g.40gb": 1}) == {"7g.80gb": 1}
    assert ml.layout_for(H100, {"3g.71gb": 1}) == {}  # H200's: not this family's
    # one set of media extensions a GPU; variants whose rules are not modelled: none
    assert ml.fits(H100, {"1g.10gb+me": 2}) is False
    rtx = ml.family_named("NVIDIA RTX PRO 6000 Blackwell Server Edition")
    assert ml.layout_for(rtx, {"1g.24gb+gfx": 1}) == {}


def test_the_recommended_config_is_one_the_mig_manager_reads():
    (r,) = recommend({"3g.40gb": 2, "1g.18gb": 1}, [H100])
    assert r.want == {"3g.40gb": 2} and r.layout == {"3g.40gb": 2}
    assert r.label == "numaguard-2x3g.40gb"
    text = yaml.safe_dump(r.config)
    assert yaml.safe_load(text) == {
        "version": "v1",
        "mig-configs": {
            "numaguard-2x3g.40gb": [
                {"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}
            ]
        },
    }
    (entry,) = ml.parse_configs(text)[r.label]
    assert entry == ml.Entry(None, {"3g.40gb": 2}, True)
    long = {f"{p}": 1 for p in ("4g.40gb", "2g.20gb", "1g.10gb")}
    assert ml.config_name(long) == "numaguard-1x4g.40gb-1x2g.20gb-1x1g.10gb"
    many = {"1g.10gb": 1, **{f"1g.10gb+x{i}": 1 for i in range(9)}}
    assert len(ml.config_name(many)) <= 63


@pytest.mark.parametrize(
    "text, error",
    [
        ("version: v2\nmig-configs: {}", "version must be v1"),
        ("version: v1\nmig-configs: [a]", "mapping of config names"),
        ("version: v1\nmig-configs: {a: []}", "config a: must be a list"),
        ("version: v1\nmig-configs: {a: [{devices: all}]}", "mig-enabled"),
        ("version: v1\nmig-configs: {a: [{devices: 0, mig-enabled: true}]}", "devices must"),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
            'mig-devices: {"1g.10gb": -1}}]}',
            "mig-devices must",
        ),
        ("version: v1\nmig-configs: {'a b': [{devices: all, mig-enabled: false}]}", "label"),
        ("{", "not YAML"),
    ],
)
def test_a_config_that_is_not_mig_parted_s_is_refused_saying_where(text, error):
    with pytest.raises(ValueError, match=error):
        ml.parse_configs(text)


def test_a_config_is_judged_per_gpu_or_not_at_all():
    assert ml.per_gpu(CONFIGS["all-3g.40gb"], 2) == [{"3g.40gb": 2}] * 2
    assert ml.per_gpu(CONFIGS["all-disabled"], 1) == [{}]
    assert ml.per_gpu(CONFIGS["filtered-3g"], 2) is None  # PCI ids are not known here
    two = ml.parse_configs(
        "version: v1\nmig-configs:\n  mixed:\n"
        "    - {devices: [0], mig-enabled: true, mig-devices: {'7g.80gb': 1}}\n"
        "    - {devices: [1], mig-enabled: true, mig-devices: {'1g.10gb': 7}}\n"
    )
    assert ml.per_gpu(two["mixed"], 2) == [{"7g.80gb": 1}, {"1g.10gb": 7}]
    assert ml.per_gpu(two["mixed"], 1) is None  # names a GPU the node lacks
    assert ml.served(H100, [{"3g.40gb": 2}] * 2, {"3g.40gb": 3}) == 3
    assert ml.served(H100, [{"3g.40gb": 3}], {"3g.40gb": 3}) is None  # would fail


def node(name="gpu-a", relayout=None, pods=(), **labels) -> MigNode:
    base = {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "2",
        MIG_CONFIG_LABEL: "all-1g.10gb",
        MIG_CONFIG_STATE_LABEL: "success",
    }
    unschedulable = labels.pop("unschedulable", relayout is not None)
    return MigNode(name, base | labels, unschedulable, relayout, gpu_pods=pods)


WANT = {"3g.40gb": 2}


def test_a_re_layout_begins_only_on_an_idle_schedulable_node_with_a_config_that_serves():
    assert steps([node()], {}, CONFIGS, SETTINGS, 100.0) == []  # nothing wanted
    (step,) = steps([node()], WANT, CONFIGS, SETTINGS, 100.0)
    assert (step.node, step.phase, step.unschedulable, step.labels) == (
        "gpu-a",
        "cordoned",
        True,
        {},
    )
    assert step.relayout == Relayout("all-3g.40gb", "all-1g.10gb", "cordoned", 100.0)
    never = [
        node(pods=("team/trainer",)),  # a GPU pod: NVML would refuse to destroy its slice
        node(pods=None),  # its pods not read
        node(unschedulable=True),  # cordoned by someone else
        node(**{MIG_CONFIG_STATE_LABEL: "pending"}),  # the manager is at work
        node(**{MIG_CONFIG_LABEL: ""}),  # not the MIG manager's
        node(**{"nvidia.com/gpu.product": "NVIDIA-H200"}),  # no config serves an H200
        node(**{MIG_CONFIG_LABEL: "all-3g.40gb"}),  # already laid out so
    ]
    for n in never:
        assert steps([n], WANT, CONFIGS, SETTINGS, 100.0) == [], n
    # the H200 gets the config of its own family's profiles
    h200 = node(**{"nvidia.com/gpu.product": "NVIDIA-H200"})
    assert best_config(h200, CONFIGS, {"3g.71gb": 1}) == ("h200-balanced", 1)
    assert best_config(h200, CONFIGS, {"3g.71gb": 3, "1g.18gb": 1}) == ("h200-balanced", 3)


def test_each_step_of_a_re_layout_and_the_ones_that_end_it():
    cordoned = Relayout("all-3g.40gb", "all-1g.10gb", "cordoned", 100.0)
    (step,) = steps([node(relayout=cordoned)], WANT, CONFIGS, SETTINGS, 130.0)
    assert step.phase == "relabelled" and step.unschedulable is None
    # the state set pending in the same write: a success read later is the manager's
    assert step.labels == {MIG_CONFIG_LABEL: "all-3g.40gb", MIG_CONFIG_STATE_LABEL: "pending"}
    assert step.relayout == Relayout("all-3g.40gb", "all-1g.10gb", "relabelled", 130.0)
    (step,) = steps([node(relayout=cordoned, pods=("team/late",))], WANT, CONFIGS, SETTINGS, 130)
    assert (step.phase, step.unschedulable, step.labels, step.relayout) == (
        "abandoned",
        False,
        {},
        None,
    )
    assert "team/late" in step.why
    assert steps([node(relayout=cordoned, pods=None)], WANT, CONFIGS, SETTINGS, 130) == []

    relabelled = Relayout("all-3g.40gb", "all-1g.10gb", "relabelled", 130.0)
    ours = {MIG_CONFIG_LABEL: "all-3g.40gb"}

    def after(now: float, state: str, **labels) -> tuple:
        labels = ours | {MIG_CONFIG_STATE_LABEL: state} | labels
        got = steps([node(relayout=relabelled, **labels)], {}, CONFIGS, SETTINGS, now)
        return tuple((s.phase, s.unschedulable, s.relayout and s.relayout.phase) for s in got)

    assert after(140, "pending") == ()
    assert after(140, "success") == (("done", False, None),)
    assert after(140, "failed") == (("failed", None, "failed"),)  # left cordoned
    assert after(729, "pending") == ()
    assert after(730, "pending") == (("wedged", None, "wedged"),)  # gpu-operator#2833
    assert after(730, "rebooting") == (("wedged", None, "wedged"),)
    # someone relabelled it meanwhile: that success is not ours
    assert after(140, "success", **{MIG_CONFIG_LABEL: "all-disabled"}) == ()
    assert after(730, "success", **{MIG_CONFIG_LABEL: "all-disabled"}) == (
        ("wedged", None, "wedged"),
    )


@pytest.mark.parametrize("phase", ["failed", "wedged", "cordoned", "relabelled"])
def test_one_node_at_a_time_and_none_after_one_failed_until_a_person_looks(phase):
    stuck = node("gpu-a", Relayout("all-3g.40gb", "all-1g.10gb", phase, 100.0), pods=None)
    idle = node("gpu-b")
    got = steps([stuck, idle], WANT, CONFIGS, SETTINGS, 110.0)
    assert all(s.node == "gpu-a" for s in got)
    forged = MigNode("gpu-a", idle.labels, False, None, doubt="not JSON")
    assert steps([forged, idle], WANT, CONFIGS, SETTINGS, 110.0) == []


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"config": "a", "previous": "b", "phase": "done", "since": 1}',
        '{"config": "a", "phase": "cordoned", "since": 1}',
        '{"config": "a", "previous": "b", "phase": "cordoned", "since": "soon"}',
        "[]",
    ],
)
def test_an_annotation_numaguard_did_not_write_is_refused(text):
    with pytest.raises(ValueError, match="mig-relayout"):
        Relayout.decode(text)


def test_the_annotation_round_trips():
    r = Relayout("all-3g.40gb", "all-1g.10gb", "relabelled", 1733500000.5)
    assert Relayout.decode(r.encode()) == r

"""Re-laying out a node's MIG slices through the GPU Operator's MIG manager (pure).

Sizing findings refused for want of a free slice of their profile (``no_fit`` on a
device-plugin slice) are the demand. A dynamic DRA driver makes slices on demand: nodes
it serves carry no ``nvidia.com/mig.config`` label and are never touched here. For the
MIG manager's nodes, ``recommend`` says which layout would serve the demand, as a
mig-parted config and its label value. ``steps`` (opt-in, the nodes of one label
selector) takes one node at a time through:

1. **cordoned**: a node whose MIG state is ``success``, schedulable, with no pod holding
   or asking for a GPU, and a config of the MIG manager's ConfigMap that serves the
   demand, is cordoned; its state goes in its annotation, so a restart forgets nothing.
2. **relabelled**: still no GPU pod (one that came before the cordon took hold ends it:
   uncordoned, nothing changed), ``nvidia.com/mig.config`` is set with its state
   ``pending`` in the same write, so that a ``success`` read later is the manager's
   answer to it (NVML refuses to destroy a slice a process uses: the manager would end
   ``failed``).
3. the manager's ``success`` for the config: uncordoned, the annotation removed.
   ``failed``, or no ``success`` within the timeout (``pending`` can wedge for good,
   gpu-operator#2833): **failed** or **wedged**, left cordoned for a person, and no other
   node re-laid out while one is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Literal

from numaguard.contract.names import (
    MIG_CONFIG_LABEL,
    MIG_CONFIG_STATE_LABEL,
    RELAYOUT_ANNOTATION,
)
from numaguard.remediator.core import miglayout
from numaguard.remediator.core.validation import FORBID_EXTRA, Seconds

IN_FLIGHT = ("cordoned", "relabelled")
STUCK = ("failed", "wedged")  # left cordoned for a person
PHASES = IN_FLIGHT + STUCK
GPU_PODS_READ = 4  # nodes whose pods are read a cycle, to find one with none


@dataclass(frozen=True)
class MigLayout:
    """The MIG manager mode: off; recommend (logs and the plan say which config would
    serve the slices sizing wants); relabel (and re-lay out the nodes of
    ``node_selector``, one at a time, to a config of ``config_map``)."""

    __pydantic_config__ = FORBID_EXTRA

    mode: Literal["off", "recommend", "relabel"] = "recommend"
    node_selector: str = ""  # a label selector; relabel needs one
    config_map: str = "gpu-operator/default-mig-parted-config"  # namespace/name
    config_key: str = "config.yaml"
    pending_timeout_seconds: Seconds = 900.0

    def __post_init__(self) -> None:
        if self.mode == "relabel" and not self.node_selector:
            raise ValueError("mode relabel needs node_selector: the nodes it may re-lay out")
        if self.config_map.count("/") != 1:
            raise ValueError(f"config_map must be namespace/name, got {self.config_map!r}")


@dataclass(frozen=True)
class Relayout:
    """A node's re-layout, as its annotation keeps it."""

    config: str  # the label value set or to be set
    previous: str  # the label value before
    phase: str
    since: float  # when the phase began

    def encode(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def decode(text: str) -> Relayout:
        """ValueError when the annotation is not one numaguard wrote."""
        try:
            got = json.loads(text)
            relayout = Relayout(
                str(got["config"]), str(got["previous"]), str(got["phase"]), float(got["since"])
            )
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"{RELAYOUT_ANNOTATION}: {err!r}") from None
        if relayout.phase not in PHASES:
            raise ValueError(f"{RELAYOUT_ANNOTATION}: no phase {relayout.phase!r}")
        return relayout


@dataclass(frozen=True)
class MigNode:
    """A node of the selector, as the API server has it."""

    name: str
    labels: Mapping[str, str]
    unschedulable: bool
    relayout: Relayout | None
    doubt: str = ""  # why its annotation could not be read: never touched
    gpu_pods: tuple[str, ...] | None = None  # pods holding or asking GPUs; None: not read
    version: str = ""  # its resourceVersion, which a write to it is conditional on

    @property
    def family(self) -> miglayout.Family | None:
        return miglayout.family_named(self.labels.get("nvidia.com/gpu.product", ""))

    @property
    def gpus(self) -> int:
        count = self.labels.get("nvidia.com/gpu.count", "")
        return int(count) if count.isdigit() else 0


@dataclass(frozen=True)
class Step:
    """One write to a node: the phase it moves to and why."""

    node: str
    phase: str  # cordoned | relabelled | failed | wedged | done | abandoned
    unschedulable: bool | None  # to set; None: unchanged
    labels: dict[str, str]  # to set
    relayout: Relayout | None  # the annotation after; None: removed
    why: str


@dataclass(frozen=True)
class Recommendation:
    family: str
    want: dict[str, int]
    layout: dict[str, int]  # of each GPU
    label: str  # nvidia.com/mig.config's value
    config: dict  # the mig-parted config that names it


def recommend(want: Mapping[str, int], families: list[miglayout.Family]) -> list[Recommendation]:
    """For each GPU family with a slice wanted, the layout serving most of it."""
    out = []
    for family in families:
        wanted = {p: n for p, n in want.items() if p in family.profiles}
        layout = miglayout.layout_for(family, wanted) if wanted else {}
        if layout:
            label = miglayout.config_name(layout)
            config = miglayout.mig_parted(label, layout)
            out.append(Recommendation(family.name, wanted, layout, label, config))
    return out


def best_config(
    node: MigNode, configs: Mapping[str, tuple[miglayout.Entry, ...]], want: Mapping[str, int]
) -> tuple[str, int]:
    """The config serving most of ``want`` on the node, and how many; ("", 0) when none
    serves more than its own."""
    family, gpus = node.family, node.gpus
    if family is None or not gpus:
        return "", 0
    best, most = "", 0
    current = node.labels.get(MIG_CONFIG_LABEL, "")
    for name in sorted(configs):
        layouts = miglayout.per_gpu(configs[name], gpus)
        n = miglayout.served(family, layouts, want) if layouts is not None else None
        if name != current and n is not None and n > most:
            best, most = name, n
    return best, most


def candidates(nodes: list[MigNode]) -> list[MigNode]:
    """Nodes a re-layout may begin on, before their pods are read."""
    return [
        n
        for n in sorted(nodes, key=lambda n: n.name)
        if n.relayout is None
        and not n.doubt
        and not n.unschedulable
        and n.labels.get(MIG_CONFIG_LABEL)
        and n.labels.get(MIG_CONFIG_STATE_LABEL) == "success"
        and n.family is not None
        and n.gpus
    ]


def steps(
    nodes: list[MigNode],
    want: Mapping[str, int],
    configs: Mapping[str, tuple[miglayout.Entry, ...]],
    settings: MigLayout,
    now: float,
) -> list[Step]:
    """This cycle's writes: each node in flight moved on, or, with none in flight or
    stuck, one node begun."""
    out = []
    for node in nodes:
        r = node.relayout
        if r is None or node.doubt or r.phase in STUCK:
            continue
        if r.phase == "cordoned":
            if node.gpu_pods is None:
                continue  # its pods not read: wait
            if node.gpu_pods:
                why = f"GPU pods came before the cordon: {', '.join(node.gpu_pods[:3])}"
                out.append(Step(node.name, "abandoned", False, {}, None, why))
            else:
                labels = {MIG_CONFIG_LABEL: r.config, MIG_CONFIG_STATE_LABEL: "pending"}
                after = Relayout(r.config, r.previous, "relabelled", now)
                why = f"no GPU pod on it: {MIG_CONFIG_LABEL}={r.config}"
                out.append(Step(node.name, "relabelled", None, labels, after, why))
            continue
        state = node.labels.get(MIG_CONFIG_STATE_LABEL, "")
        ours = node.labels.get(MIG_CONFIG_LABEL) == r.config
        if ours and state == "success":
            out.append(
                Step(node.name, "done", False, {}, None, f"the MIG manager applied {r.config}")
            )
        elif ours and state == "failed":
            after = Relayout(r.config, r.previous, "failed", now)
            why = f"the MIG manager failed to apply {r.config}: left cordoned for a person"
            out.append(Step(node.name, "failed", None, {}, after, why))
        elif now - r.since >= settings.pending_timeout_seconds:
            after = Relayout(r.config, r.previous, "wedged", now)
            why = (
                f"no success for {r.config} in {settings.pending_timeout_seconds:g}s "
                f"({MIG_CONFIG_LABEL}={node.labels.get(MIG_CONFIG_LABEL, '')!r}, state "
                f"{state!r}): left cordoned for a person"
            )
            out.append(Step(node.name, "wedged", None, {}, after, why))
    busy = any(n.relayout is not None or n.doubt for n in nodes)
    if busy or not want:
        return out
    for node in candidates(nodes):
        if node.gpu_pods is None or node.gpu_pods:
            continue
        config, n = best_config(node, configs, want)
        if config:
            previous = node.labels[MIG_CONFIG_LABEL]
            after = Relayout(config, previous, "cordoned", now)
            why = f"{config} holds {n} of the wanted slices ({_wanted(want)}); no GPU pod on it"
            out.append(Step(node.name, "cordoned", True, {}, after, why))
            break
    return out


def _wanted(want: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {p}" for p, n in sorted(want.items()))

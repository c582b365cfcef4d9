"""Core isolation findings (pure): when evicting a pod whose exclusive CPUs share a busy
core, or span more L3 caches than they need, gives it a better layout, and what to say
where it would not.

The kubelet's static CPU manager lays a pod out so unless an option tells it otherwise
(``full-pcpus-only``: whole cores only; ``prefer-align-cpus-by-uncorecache``: as few L3
caches as it can), and it keeps a running pod's CPUs when the option is turned on
(checkpointed allocations stand until the node is drained). So:

* a node without the option gets a recommendation naming it: an eviction would repeat
  the layout;
* on a node with it, the pod is evicted to a zone of a node with it that has room in
  whole cores (or in one cache) for all its CPUs — unless its CPU count is no multiple of
  the node's CPUs a core, which ``full-pcpus-only`` refuses (``SMTAlignmentError``):
  then the request to ask instead is said.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from numaguard.contract.reasons import ISOLATION_OPTIONS, L3_SPAN, OPTION_TRUE, SMT_SHARED
from numaguard.remediator.core.findings import Finding

# the room in a zone each reason's replacement needs, by its query (queries.py)
ROOM = {SMT_SHARED: "zone_free_whole_cores", L3_SPAN: "zone_l3_most_free"}


def option_on(options: Mapping[str, str], option: str) -> bool:
    return options.get(option) in OPTION_TRUE


def whole_cores(cpus: float, per_core: int) -> int:
    """The fewest CPUs of whole cores that hold ``cpus``: what full-pcpus-only admits."""
    return math.ceil(cpus / per_core) * per_core


def node_advice(f: Finding, hurt: int) -> str:
    """Why no eviction fixes ``f`` on its node, and the option that would."""
    option = ISOLATION_OPTIONS[f.reason]
    what = "share a core" if f.reason == SMT_SHARED else "span more L3 caches than they need"
    return (
        f"the kubelet of {f.node} runs without the CPU manager option {option}: "
        f"{hurt} pod(s) there have exclusive CPUs that {what}, and an eviction would lay "
        f'its replacement out so again; set {option}: "true" (drain the node: the '
        f"kubelet keeps running pods' CPUs) (core_isolation: {f.reason})"
    )


def refused_advice(f: Finding, cpus: float, per_core: int) -> str:
    """For a pod whose CPU count full-pcpus-only refuses: the request it admits."""
    return (
        f"its {cpus:g} exclusive CPUs are no multiple of the {per_core} CPUs a core of "
        f"{f.node}: with {ISOLATION_OPTIONS[SMT_SHARED]} a replacement would be refused "
        f"(SMTAlignmentError); ask {whole_cores(cpus, per_core)} CPUs "
        f"(core_isolation: {f.reason})"
    )

"""The Kubernetes names numaguard writes or reads on other objects: its annotations and
labels (each a numaguard.io/ key, all of them here) and the extended resources a MIG
slice is asked for by."""

from __future__ import annotations

import re

# -- on pods ------------------------------------------------------------------------------

# A pod asks its node's exporter to move its memory home by carrying this annotation; its
# value names the request (the remediator's action), so that each is carried out once.
# Whoever writes it, the move is bounded: the annotated pod's own memory, to its own
# CPUs' node (exporter/mover/orders.py); only the remediator may write it (its policy).
REQUEST_ANNOTATION = "numaguard.io/move-memory"
REQUEST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,62}")  # a value that names a request
# set to "false" (on a pod or its workload), keeps the remediator from acting on it
OPT_OUT = "numaguard.io/remediate"

# -- on workloads -------------------------------------------------------------------------

HISTORY_ANNOTATION = "numaguard.io/history"  # the workload's history, JSON
PENDING_LABEL = "numaguard.io/pending"  # "true" while an action awaits verification
# "true": a MIG resize may be applied to it, not only recommended
AUTO_RESIZE_ANNOTATION = "numaguard.io/auto-resize"
# "required" makes the steering webhook's node affinity required, not preferred
STEER_ANNOTATION = "numaguard.io/steer"

# -- on nodes ----------------------------------------------------------------------------

# the GPU Operator's MIG manager: the config it applies (set by whoever re-lays out the
# node), and its state: pending, rebooting, success or failed
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_CONFIG_STATE_LABEL = "nvidia.com/mig.config.state"
# a re-layout numaguard began on the node (core/relayout.py), JSON: gone once it is done
RELAYOUT_ANNOTATION = "numaguard.io/mig-relayout"

# -- on numaguard's own objects -----------------------------------------------------------

# on a ResourceClaimTemplate a MIG resize made: "true", and the name of the template it
# replaced, deleted once no pod or workload uses it any more
RESIZED_LABEL = "numaguard.io/resized"
REPLACES_ANNOTATION = "numaguard.io/replaces"

# on the webhook configuration: webhook name -> {"workload": ..., "until": ...}
STEERING_ANNOTATION = "numaguard.io/steering"
PAUSE_ANNOTATION = "numaguard.io/paused"  # on the Lease: no replica acts while "true"


def mig_resource(profile: str) -> str:
    """The extended resource the device plugin's ``mixed`` strategy names a profile's
    slices by: ``nvidia.com/mig-1g.10gb``; a ``+`` is not allowed there and becomes ``.``
    (``1g.10gb+me`` -> ``nvidia.com/mig-1g.10gb.me``), a ``-`` stays."""
    return f"nvidia.com/mig-{profile.replace('+', '.')}"

"""Steering (pure): the mutating webhook configuration that sends an evicted pod's
replacement to the nodes whose zones fit, and the mutation itself.

The API server calls the webhook only for pods created in the namespace of a workload
awaiting verification that carry its selector's labels (namespaceSelector and
objectSelector: no other pod creation waits on it), with failurePolicy Ignore and a short
timeout. Each webhook's path names its nodes, so any replica answers from the request
alone; the configuration is the remediator's own object, written by the leader only, and
is the whole of the steering state: an entry leaves it when its workload no longer awaits
verification or its deadline passed, or when the leader stops; and it names its deadline,
past which it steers nothing, whoever answers."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
from dataclasses import dataclass

from numaguard.contract.names import STEERING_ANNOTATION
from numaguard.remediator.core.reach import NODES_PER_FINDING

PATH = "/steer"
MODES = ("preferred", "required")
TIMEOUT_SECONDS = 2  # pod creation never waits longer on it (failurePolicy Ignore)
# what may go into a path, a label selector and a CEL-free configuration unquoted
_NODE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_./]{0,314}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Steer:
    """Send the replacements of ``workload`` (pods in its namespace with its selector's
    labels) to ``nodes`` until ``until``."""

    workload: str  # kind/namespace/name
    labels: dict[str, str]  # the selector of the controller that makes its pods
    nodes: tuple[str, ...]
    required: bool
    until: float


@dataclass(frozen=True)
class Target:
    """Where the API server reaches the webhook: a Service of the remediator's (in the
    cluster) or a URL (a remediator outside it), and the CA it checks it with."""

    configuration: str  # the MutatingWebhookConfiguration's name
    ca_bundle: str  # PEM
    service: dict | None = None  # {namespace, name, port}
    url: str = ""  # https://host:port, without a path


def steerable(s: Steer) -> str | None:
    """Why ``s`` cannot be written into a configuration, or None."""
    if not s.nodes or len(s.nodes) > NODES_PER_FINDING:
        return f"{len(s.nodes)} nodes (1 to {NODES_PER_FINDING} can be steered to)"
    if not all(_NODE.match(n) for n in s.nodes):
        return "a node name that is no DNS subdomain"
    if not s.labels:
        return "its controller's selector has no matchLabels"
    if not all(_LABEL.match(k) and (not v or _LABEL.match(v)) for k, v in s.labels.items()):
        return "a selector label no API server would store"
    return None


def webhook_name(workload: str) -> str:
    return f"{hashlib.sha256(workload.encode()).hexdigest()[:20]}.steer.numaguard.io"


def webhook(s: Steer, target: Target) -> dict:
    namespace = s.workload.split("/")[1]
    # its deadline in its path: past it, whoever answers leaves the pod as it is, though
    # nobody removed the entry (every replica stopped, say)
    path = f"{PATH}/{MODES[s.required]}/{int(s.until)}/{','.join(s.nodes)}"
    if target.service is not None:
        client = {"service": {**target.service, "path": path}}
    else:
        client = {"url": target.url.rstrip("/") + path}
    client["caBundle"] = base64.b64encode(target.ca_bundle.encode()).decode()
    return {
        "name": webhook_name(s.workload),
        "admissionReviewVersions": ["v1"],
        "clientConfig": client,
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "objectSelector": {"matchLabels": dict(s.labels)},
        "matchConditions": [
            {
                "name": "made-by-a-controller",
                "expression": "object.metadata.?ownerReferences.orValue([])"
                ".exists(o, o.?controller.orValue(false))",
            }
        ],
        "failurePolicy": "Ignore",
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "reinvocationPolicy": "Never",
    }


def configured(
    config: dict,
    target: Target,
    now: float,
    add: tuple[Steer, ...] = (),
    pending: frozenset[str] | None = None,
) -> dict | None:
    """The configuration with ``add`` in it, and without the entries whose deadline
    passed or (``pending`` given) whose workload no longer awaits verification; None
    when that changes nothing. Entries it did not write are dropped: the object is
    numaguard's alone."""
    before = _state(config)  # unreadable: none is kept, all is rewritten from `add`
    kept = {}
    for w in config.get("webhooks") or []:
        s = before.get(w.get("name"))
        if not isinstance(s, dict) or not isinstance(s.get("until"), (int, float)):
            continue  # not one it wrote
        if s["until"] > now and (pending is None or s.get("workload") in pending):
            kept[w["name"]] = (w, s)
    for s in add:
        kept[webhook_name(s.workload)] = (
            webhook(s, target),
            {"workload": s.workload, "until": s.until},
        )
    webhooks = [w for w, _ in kept.values()]
    state = {name: s for name, (_, s) in kept.items()}
    names = [w.get("name") for w in config.get("webhooks") or []]
    if not add and names == list(kept) and state == before:
        return None  # entries kept are kept as the API server defaulted them
    out = copy.deepcopy(config)
    out.setdefault("metadata", {}).setdefault("annotations", {})[STEERING_ANNOTATION] = json.dumps(
        state, sort_keys=True, separators=(",", ":")
    )
    out["webhooks"] = webhooks
    return out


def _state(config: dict) -> dict:
    """Webhook name -> {workload, until}, as written; {} when unreadable."""
    text = ((config.get("metadata") or {}).get("annotations") or {}).get(STEERING_ANNOTATION)
    try:
        state = json.loads(text) if text else {}
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def steered_to(path: str, now: float) -> tuple[bool, tuple[str, ...]] | None:
    """(required, nodes) a webhook path names, or None for a path no entry has or one
    whose deadline passed."""
    parts = path.removeprefix(PATH + "/").split("/")
    if len(parts) != 3 or parts[0] not in MODES or not parts[1].isdigit():
        return None
    nodes = tuple(parts[2].split(","))
    if not 0 < len(nodes) <= NODES_PER_FINDING or not all(_NODE.match(n) for n in nodes):
        return None
    if int(parts[1]) <= now:
        return None
    return parts[0] == "required", nodes


def mutation(pod: dict, nodes: tuple[str, ...], required: bool) -> list[dict]:
    """The JSON patch that asks the scheduler for one of ``nodes`` (the plan's own
    first): a preferred node affinity term per node (weight 100 for the first, 50 for
    the others), or, required, each of the pod's own required terms narrowed to each
    node (matchFields on metadata.name takes one value per term)."""
    affinity = copy.deepcopy((pod.get("spec") or {}).get("affinity") or {})
    node_affinity = affinity.setdefault("nodeAffinity", {})

    def field(node: str) -> list[dict]:
        return [{"key": "metadata.name", "operator": "In", "values": [node]}]

    if required:
        req = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        own = req.get("nodeSelectorTerms") or [{}]
        req["nodeSelectorTerms"] = [
            {**t, "matchFields": [*(t.get("matchFields") or []), *field(n)]}
            for t in own
            for n in nodes
        ]
    else:
        preferred = node_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
        preferred.extend(
            {"weight": 100 if i == 0 else 50, "preference": {"matchFields": field(n)}}
            for i, n in enumerate(nodes)
        )
    return [{"op": "add", "path": "/spec/affinity", "value": affinity}]

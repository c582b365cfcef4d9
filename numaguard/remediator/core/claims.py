"""MIG slices asked for through DRA ResourceClaims (pure): which profile a claim's spec
selects, the same spec asking for another, and how a workload's slice can be resized.

A claim asks for a profile by name with a CEL selector on the driver's ``profile``
attribute (``device.attributes["gpu.nvidia.com"].profile == "1g.10gb"``, as the KEP and
NVIDIA's driver document it). A claim's and a template's spec are immutable (the API
server refuses an update), so a workload whose pods get their slice from a template is
resized by a new template and a new reference in its pod template; a shared claim
(``resourceClaimName``) is other pods' too and is never resized.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

from numaguard.contract.names import mig_resource

_SELECTOR = re.compile(
    r"""(device\.attributes\[\s*(["'])[a-z0-9.-]+\2\s*\]\.profile\s*==\s*)(["'])([^"']+)\3"""
)
RESOURCES, TEMPLATE, SHARED = "resources", "claim_template", "shared_claim"
RESOURCE_API = "/apis/resource.k8s.io/v1"  # DRA's API, GA since Kubernetes 1.34


@dataclass(frozen=True)
class ClaimRef:
    """One of a pod's ResourceClaims: from a template or a shared claim, and the MIG
    profile its spec selects ("" when none by name)."""

    name: str  # the pod's name for it (spec.resourceClaims[].name)
    template: str = ""  # resourceClaimTemplateName
    claim: str = ""  # resourceClaimName
    profile: str = ""


def claim_profile(spec: dict) -> str:
    """The one MIG profile a ResourceClaimSpec's requests select by name; "" when none,
    or several."""
    found = set()
    for request in ((spec or {}).get("devices") or {}).get("requests") or ():
        exactly = (request or {}).get("exactly") or {}
        for selector in exactly.get("selectors") or ():
            expression = ((selector or {}).get("cel") or {}).get("expression") or ""
            found.update(m[4] for m in _SELECTOR.finditer(expression))
    return next(iter(found)) if len(found) == 1 else ""


def with_profile(spec: dict, old: str, new: str) -> dict:
    """A copy of a claim's spec that selects ``new`` where it selected ``old``, nothing
    else changed."""
    changed = copy.deepcopy(spec)
    for request in changed["devices"]["requests"]:
        for selector in (request.get("exactly") or {}).get("selectors") or ():
            cel = selector.get("cel") or {}
            if "expression" in cel:
                cel["expression"] = _SELECTOR.sub(
                    lambda m: f"{m[1]}{m[3]}{new}{m[3]}" if m[4] == old else m[0],
                    cel["expression"],
                )
    return changed


def template_name(workload: str, profile: str) -> str:
    """The new template's name: the workload's and the profile's (a DNS subdomain)."""
    suffix = "-mig-" + re.sub(r"[^a-z0-9-]+", "-", profile.lower()).strip("-")
    return workload[: 253 - len(suffix)].rstrip("-.") + suffix


def mechanism(resources: frozenset[str], claims: tuple[ClaimRef, ...], profile: str):
    """How a pod holding a slice of ``profile`` gets it, so how it can be resized:
    (RESOURCES, None) its containers request nvidia.com/mig-<profile> (a device plugin,
    or a DeviceClass's extended resource); (TEMPLATE, claim) a claim from a template;
    (SHARED, claim) a shared claim; (None, None) none of these says so."""
    if mig_resource(profile) in resources:
        return RESOURCES, None
    for claim in claims:
        if claim.profile == profile:
            return (TEMPLATE if claim.template else SHARED), claim
    return None, None

"""The kubelet's configuration file (a KubeletConfiguration, YAML): what its Topology
Manager does, for the NodeResourceTopology the exporter publishes."""

from __future__ import annotations

import yaml

from numaguard.exporter.readers import ParseError

# what the kubelet does when its configuration sets nothing
DEFAULT_POLICY = "none"
DEFAULT_SCOPE = "container"


def topology_manager(text: str) -> tuple[str, str]:
    """(policy, scope): ``topologyManagerPolicy`` and ``topologyManagerScope``."""
    try:
        config = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError) as err:  # a 5,000-digit number...
        raise ParseError(f"not a YAML the kubelet reads: {str(err)[:80]}") from None
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ParseError("not a KubeletConfiguration mapping")
    policy = config.get("topologyManagerPolicy", DEFAULT_POLICY)
    scope = config.get("topologyManagerScope", DEFAULT_SCOPE)
    if not isinstance(policy, str) or not isinstance(scope, str):
        raise ParseError("topologyManagerPolicy and topologyManagerScope must be strings")
    return policy, scope

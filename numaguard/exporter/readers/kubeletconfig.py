"""The kubelet's configuration file (a KubeletConfiguration, YAML): what its Topology
Manager and CPU manager do."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from numaguard.exporter.readers import ParseError, parse_id_list

# what the kubelet does when its configuration sets nothing
DEFAULT_POLICY = "none"
DEFAULT_SCOPE = "container"
DEFAULT_CPU_MANAGER_POLICY = "none"


@dataclass(frozen=True, slots=True)
class CpuManager:
    """``cpuManagerPolicy``, ``cpuManagerPolicyOptions`` (option -> its text, as the
    kubelet takes them: "true", "false") and ``reservedSystemCPUs`` (None: not set)."""

    policy: str
    options: Mapping[str, str]
    reserved: frozenset[int] | None


def _config(text: str) -> dict:
    try:
        config = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError) as err:  # a 5,000-digit number...
        raise ParseError(f"not a YAML the kubelet reads: {str(err)[:80]}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ParseError("not a KubeletConfiguration mapping")
    return config


@dataclass(frozen=True, slots=True)
class KubeletConfig:
    """What the kubelet's resource managers do, as its configuration file says: the
    Topology Manager's ``topologyManagerPolicy`` and ``topologyManagerScope``, and its
    CPU manager."""

    topology_policy: str
    topology_scope: str
    cpu_manager: CpuManager


def parse_kubelet_config(text: str) -> KubeletConfig:
    """The file as the kubelet reads it, its defaults where it sets nothing; ParseError
    where the kubelet would refuse it (it refuses the whole file)."""
    config = _config(text)
    policy = config.get("topologyManagerPolicy", DEFAULT_POLICY)
    scope = config.get("topologyManagerScope", DEFAULT_SCOPE)
    if not isinstance(policy, str) or not isinstance(scope, str):
        raise ParseError("topologyManagerPolicy and topologyManagerScope must be strings")
    return KubeletConfig(policy, scope, _cpu_manager(config))


def _cpu_manager(config: dict) -> CpuManager:
    policy = config.get("cpuManagerPolicy", DEFAULT_CPU_MANAGER_POLICY)
    options = config.get("cpuManagerPolicyOptions")
    options = {} if options is None else options
    reserved = config.get("reservedSystemCPUs")
    if not isinstance(policy, str):
        raise ParseError("cpuManagerPolicy must be a string")
    # a map of strings to strings, as the kubelet's config type has it
    if not isinstance(options, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in options.items()
    ):
        raise ParseError("cpuManagerPolicyOptions must map strings to strings")
    if reserved is not None and not isinstance(reserved, str):
        raise ParseError("reservedSystemCPUs must be a CPU list string")
    cpus = parse_id_list(reserved) if reserved and reserved.strip() else None
    return CpuManager(policy, dict(sorted(options.items())), cpus)

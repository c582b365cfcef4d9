"""The GPU Operator's MIG manager, as NVIDIA/mig-parted's nvidia-mig-manager runs on a
node: it follows the node's ``nvidia.com/mig.config`` label and reports in
``nvidia.com/mig.config.state``. On a change it sets ``pending``, pauses the GPU
operands (their ``nvidia.com/gpu.deploy.*`` labels ``paused-for-mig-change``), applies
the named config of its ConfigMap GPU by GPU — each GPU instance destroyed, which NVML
refuses while a process runs on it (NVML_ERROR_IN_USE: the state ends ``failed``) —
then restores the operands and sets ``success``. ``wedged`` nodes stop at ``pending``
with their operands paused, as gpu-operator#2833 saw when a client's shutdown timed out.
A mixin of SimulatedCluster, on the nodes given a ``mig_config``."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pynvml as N
import yaml

from numaguard.simulator.cluster.node import SimNode, advertised
from numaguard.simulator.parts.controlplane import ApiError

CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"
# the operands it stops while it re-lays out the GPUs (mig-parted's reconfigure script)
OPERANDS = ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm")
PAUSED = "paused-for-mig-change"
CONFIG_MAP = ("gpu-operator", "default-mig-parted-config", "config.yaml")


def mig_manager_labels(node: SimNode) -> dict[str, str]:
    """A node's labels while its MIG manager has applied its config."""
    if not node.mig_config:
        return {}
    deploy = {f"nvidia.com/gpu.deploy.{o}": "true" for o in OPERANDS}
    return {CONFIG: node.mig_config, STATE: "success", **deploy}


class MigManager:
    async def _mig_manager(self) -> None:
        """Every node's manager, as the real one watches its Node: each change of its
        label applied once, in turn."""
        applied = {n.name: n.mig_config for n in self.nodes.values() if n.mig_config}
        version = ""
        while True:
            try:
                if not version:
                    listing = await self.cp.call(self.session, "GET", "/api/v1/nodes")
                    for node in listing["items"]:
                        await self._on_node(node, applied)
                    version = listing["metadata"]["resourceVersion"]
                version = await self._watch_nodes(version, applied)
            except (aiohttp.ClientError, ApiError, OSError, TimeoutError):
                await asyncio.sleep(0.2)  # the next list or watch will do

    async def _watch_nodes(self, version: str, applied: dict[str, str]) -> str:
        async def on_event(type_: str, node: dict) -> None:
            if type_ in ("ADDED", "MODIFIED"):
                await self._on_node(node, applied)

        return await self.cp.watch(self.session, "/api/v1/nodes", version, on_event)

    async def _on_node(self, node: dict, applied: dict[str, str]) -> None:
        meta = node.get("metadata") or {}
        name = meta.get("name", "")
        wanted = (meta.get("labels") or {}).get(CONFIG)
        if name in applied and wanted and wanted != applied[name]:
            applied[name] = wanted
            await self._reconfigure(self.nodes[name], wanted)

    async def _reconfigure(self, node: SimNode, config: str) -> None:
        paused = {f"nvidia.com/gpu.deploy.{o}": PAUSED for o in OPERANDS}
        await self._label(node, {STATE: "pending", **paused})
        if node.mig_wedged:
            return  # a client that never stops: pending for good
        state = "success" if await self._apply(node, config) else "failed"
        node.mig_config = config
        node.write()  # what NVML shows the exporter
        capacity = {"capacity": advertised(node), "allocatable": advertised(node)}
        with contextlib.suppress(ApiError):  # what the device plugin advertises
            await self.cp.patch(
                self.session, "Node", None, node.name, {"status": capacity}, "status"
            )
        restored = {f"nvidia.com/gpu.deploy.{o}": "true" for o in OPERANDS}
        await self._label(node, {STATE: state, **restored})

    async def _apply(self, node: SimNode, config: str) -> bool:
        """The config's layout on the node's GPUs; False where it stopped."""
        namespace, name, key = CONFIG_MAP
        found = await self.cp.get(self.session, "ConfigMap", namespace, name)
        try:
            entries = yaml.safe_load(found["data"][key])["mig-configs"][config]
        except (TypeError, KeyError, yaml.YAMLError):
            return False  # no such config: mig-parted fails
        for entry in entries:
            devices = entry["devices"]
            indexes = range(len(node.nvml.gpus)) if devices == "all" else devices
            layout = entry.get("mig-devices") or {}
            profiles = [p for p, n in layout.items() for _ in range(n)]
            for i in indexes:
                try:
                    for gone in list(node.nvml.gpus[i].mig or []):
                        node.nvml.destroy_slice(i, gone.uuid)
                    node.nvml.set_mig(i, profiles if entry["mig-enabled"] else None)
                except N.NVMLError:
                    return False  # NVML_ERROR_IN_USE: a process on a slice
                except ValueError:
                    return False  # the layout does not fit the GPU
        return True

    async def _label(self, node: SimNode, labels: dict[str, str]) -> None:
        patch = {"metadata": {"labels": labels}}
        await self.cp.patch(self.session, "Node", None, node.name, patch)

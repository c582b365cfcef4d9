"""GPUs and MIG slices: activity, holders, starvation, DRA counters, and how GPUs reach
each other (links)."""

from __future__ import annotations

from numaguard.contract.catalogue.spec import (
    CONTAINER,
    POD,
    declare,
)
from numaguard.contract.reasons import STARVED_REASONS

# -- GPUs and MIG slices ------------------------------------------------------------
GPU = ("gpu", "gpu_uuid")
SLICE = (*GPU, "mig_uuid", "mig_profile")
_KIND = (
    "kind: sm (share of SMs busy), graphics (time any context was active), sm_occupancy "
    "(active warps vs the maximum), tensor (time tensor cores were busy), dram_bandwidth "
    "(DRAM bandwidth used vs the maximum)"
)

GPU_INFO = declare(
    "gpu_info",
    "gauge",
    "A GPU NVML sees; value 1. numa_node is where its PCIe root hangs (empty: unknown); "
    "mig_mode is enabled or disabled; driver_version and nvml_version are the node's "
    "(empty: NVML would not say).",
    (*GPU, "model", "pci_bus_id", "numa_node", "mig_mode", "driver_version", "nvml_version"),
    "gpu",
)
GPU_UP = declare(
    "gpu_up",
    "gauge",
    "1 when the GPU answered NVML this cycle; 0 when it is lost, its calls hung past the "
    'deadline, or it could not be named (see collector_errors_total{collector="gpu"}).',
    GPU,
    "gpu",
)
GPU_POWER = declare("gpu_power_watts", "gauge", "Power draw, once per GPU.", GPU, "gpu")
GPU_TEMPERATURE = declare(
    "gpu_temperature_celsius", "gauge", "GPU core temperature, once per GPU.", GPU, "gpu"
)
GPU_MEMORY_TOTAL = declare("gpu_memory_total_bytes", "gauge", "Frame buffer size.", GPU, "gpu")
GPU_MEMORY_USED = declare(
    "gpu_memory_used_bytes", "gauge", "Frame buffer in use (all slices, with MIG on).", GPU, "gpu"
)
GPU_UTILIZATION = declare(
    "gpu_utilization_ratio",
    "gauge",
    "Whole-GPU activity over the last interval, 0..1, by " + _KIND + ". Only kinds the GPU "
    "measures appear (GPM on Hopper and later; graphics from the utilization rates "
    "otherwise).",
    (*GPU, "kind"),
    "gpu",
)
GPU_UTILIZATION_SUPPORTED = declare(
    "gpu_utilization_supported",
    "gauge",
    "1 when the GPU can measure this kind of activity, 0 when it cannot: a missing "
    "utilization is then unknown, not idle.",
    (*GPU, "kind"),
    "gpu",
)
GPU_PCIE = declare(
    "gpu_pcie_bytes_per_second",
    "gauge",
    "PCIe traffic over the last interval (GPM), direction tx (from the GPU) or rx.",
    (*GPU, "direction"),
    "gpu",
)
GPU_PROCESSES = declare(
    "gpu_processes",
    "gauge",
    "Compute processes on a GPU with MIG off (with MIG on, see mig_processes).",
    GPU,
    "gpu",
)
MIG_INFO = declare(
    "mig_info",
    "gauge",
    "A MIG slice; value 1. gi_id and ci_id are its GPU and compute instance; placement "
    "is its first memory slice and their count, of 8.",
    (*SLICE, "gi_id", "ci_id", "placement_start", "placement_size"),
    "gpu",
)
MIG_SMS = declare(
    "mig_multiprocessors",
    "gauge",
    "Streaming multiprocessors of the slice, as the driver reports them.",
    SLICE,
    "gpu",
)
MIG_MEMORY_TOTAL = declare("mig_memory_total_bytes", "gauge", "The slice's memory.", SLICE, "gpu")
MIG_MEMORY_USED = declare(
    "mig_memory_used_bytes", "gauge", "The slice's memory in use.", SLICE, "gpu"
)
MIG_UTILIZATION = declare(
    "mig_utilization_ratio",
    "gauge",
    "The slice's own activity over the last interval, 0..1 of the slice (not of the GPU), "
    "by " + _KIND + ". From GPM (Hopper and later); absent where unsupported.",
    (*SLICE, "kind"),
    "gpu",
)
MIG_UTILIZATION_SUPPORTED = declare(
    "mig_utilization_supported",
    "gauge",
    "0 when the slice's activity of this kind cannot be measured: GPUs without GPM "
    "(A100), where NVML has no per-slice utilization. 1, where it can, only with --detail: "
    "by default the kind's numaguard_mig_utilization_ratio says so.",
    (*SLICE, "kind"),
    "gpu",
)
MIG_PCIE = declare(
    "mig_pcie_bytes_per_second",
    "gauge",
    "The slice's PCIe traffic over the last interval (GPM), direction tx or rx.",
    (*SLICE, "direction"),
    "gpu",
    detail=True,
)
MIG_PROCESSES = declare("mig_processes", "gauge", "Compute processes on the slice.", SLICE, "gpu")
GPU_HOLDER = declare(
    "gpu_holder_info",
    "gauge",
    "A pod container using a GPU (mig_uuid empty) or MIG slice; value 1. resource is the "
    "extended resource it stands for (for a DRA claim: its driver); numa_node is the "
    "device's; source says how it was found: kubelet (PodResources allocation), claim "
    "(the pod's DRA ResourceClaim, where the kubelet does not report claims) or process "
    "(a process of the container runs on a device neither says anything about).",
    (*GPU, "mig_uuid", "resource", "numa_node", *CONTAINER, "source"),
    "gpu",
)

GPU_STARVED = declare(
    "gpu_starved",
    "gauge",
    "1 when a GPU or MIG slice (mig_uuid empty: a whole GPU) with processes on it was "
    "barely busy over the last interval (SM activity under --gpu-starved-utilization) "
    "while its pod's host side held it back for the reason given: "
    + "; ".join(
        f"{r.name}: {r.measure}"
        + (f", at least --gpu-starved-{r.name.replace('_', '-')}" if r.default is not None else "")
        for r in STARVED_REASONS
    )
    + ". 0 when that reason does not hold; absent when it cannot be decided.",
    (*GPU, "mig_uuid", "namespace", "pod", "pod_uid", "reason"),
    "gpu",
)

# -- DRA's partitionable devices (KEP-4815): a GPU's counter set under DynamicMIG ---------
_COUNTER_SET = ("driver", "counter_set", "gpu_uuid")
DRA_COUNTER = declare(
    "dra_counter",
    "gauge",
    "A counter of a DRA counter set (one per GPU under NVIDIA's DynamicMIG: multiprocessors, "
    "memory in bytes, memory-slice-<i>, the last only with --detail) of the node's complete "
    "ResourceSlice pools: state capacity (what the driver publishes) or consumed (by the "
    "devices the node's pods' claims were allocated; absent while a claim is not read "
    "yet). gpu_uuid is the GPU whose devices consume it.",
    (*_COUNTER_SET, "counter", "state"),
    "gpu",
)
GPU_MIG_PROFILES_FREE = declare(
    "gpu_mig_profiles_free",
    "gauge",
    "How many more MIG slices of the profile the GPU's DRA counters still allow, given the "
    "placements already allocated: the most of its free placements that fit together, as "
    "the scheduler allocates them. Absent while a claim of the node's pods is not read.",
    (*_COUNTER_SET, "mig_profile"),
    "gpu",
)
DRA_COUNTER_MISMATCH = declare(
    "dra_counter_mismatch_slices",
    "gauge",
    "Memory slices of the GPU where DRA and NVML disagree, by kind: "
    "claimed_without_instance (an allocated MIG device's slice with no GPU instance on it: "
    "the driver has not made it yet, or lost it) or instance_without_claim (a GPU instance "
    "no allocated device accounts for: made outside DRA, or left behind). Brief while a "
    "claim is prepared or released; absent when NVML or the claims do not say.",
    (*_COUNTER_SET, "kind"),
    "gpu",
)

GPU_NVLINK = declare(
    "gpu_nvlink_bytes_per_second",
    "gauge",
    "NVLink data over the last interval, all the GPU's links together, direction tx (from "
    "the GPU) or rx: GPM's NVLINK_TOTAL_TX/RX_PER_SEC on Hopper and later, else the "
    "difference of NVML's NVLINK_THROUGHPUT_DATA_TX/RX counters (fields 138/139, all "
    "links). Only for GPUs with active NVLinks that are measured "
    "(numaguard_gpu_nvlink_supported), from the second cycle on.",
    (*GPU, "direction"),
    "gpu",
)
GPU_NVLINK_SUPPORTED = declare(
    "gpu_nvlink_supported",
    "gauge",
    "1 when the GPU has active NVLinks whose traffic is measured "
    "(numaguard_gpu_nvlink_bytes_per_second: GPM, or NVML's throughput counters); 0 when "
    "it has none, or its driver measures neither. Absent while its links, or what "
    "measures them, are unknown (a failed read).",
    GPU,
    "gpu",
)
GPU_LINK_MISMATCH = declare(
    "gpu_link_level_mismatch_pairs",
    "gauge",
    "Pairs of the node's GPUs whose PCIe level NVML (nvmlDeviceGetTopologyCommonAncestor) "
    "and the sysfs PCI tree (root complex, bridges, NUMA node) give differently. Absent "
    "when neither can be compared.",
    (),
    "gpu",
)
GPU_LINK = declare(
    "gpu_link_info",
    "gauge",
    "1 for each pair of full GPUs (gpu the lower index): how they reach each other, as "
    "nvidia-smi topo -m names it (nvlink, pix, pxb, phb, node, sys; unknown when NVML and "
    "sysfs cannot say), with their NVLinks (direct, or the fewer of their NVSwitch links) "
    "and whether P2P read and write work (yes, no, unknown).",
    ("gpu", "peer_gpu", "level", "nvlinks", "p2p"),
    "gpu",
    detail=True,
)
POD_GPU_LINK = declare(
    "pod_gpu_link",
    "gauge",
    "1, for a pod holding two or more full GPUs, at the level of its worst pair: nvlink, "
    "pix, pxb, phb, node or sys (nvidia-smi topo -m's names; NCCL uses P2P up to pxb by "
    "default). Absent when a pair's level is unknown.",
    (*POD, "level"),
    "gpu",
)
POD_GPU_P2P = declare(
    "pod_gpu_p2p_pairs",
    "gauge",
    "A pod's pairs of full GPUs whose P2P read and write work (state ok: the driver says "
    "so, or NVLink joins them) or not (no). Absent when a pair's status is unknown.",
    (*POD, "state"),
    "gpu",
)
POD_GPU_LINK_POOR = declare(
    "pod_gpu_link_poor",
    "gauge",
    "1 when a pod holding two or more GPUs or MIG slices cannot move data between them "
    "peer to peer, for the reason given: no_p2p (two of its full GPUs joined beyond pxb, "
    "or P2P refused), split_containers (its devices are in different containers: no CUDA "
    "IPC nor NVLink between them, NVIDIA/nccl#324), mig_slices (two or more slices: MIG "
    "does no P2P). 0 when the reason does not hold; absent when it cannot be decided.",
    (*POD, "reason"),
    "gpu",
)
POD_GPU_FRAGMENTING = declare(
    "pod_gpu_fragmenting",
    "gauge",
    "1 when a pod holding one full GPU holds half of the only joined pairs left on its "
    "NUMA node (reason breaks_pair): its GPU and a free one there are joined at pxb or "
    "better, no two free GPUs there are; moved elsewhere, it leaves a pair a multi-GPU pod "
    "could do P2P on (NVIDIA/k8s-device-plugin#1193). 0 otherwise; absent where a level "
    "it rests on, or what the kubelet gave out, is unknown.",
    (*POD, "reason"),
    "gpu",
)

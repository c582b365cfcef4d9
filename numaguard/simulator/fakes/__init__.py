"""Fakes of what cannot run here for real, faithful at the protocol boundary: host roots
(sysfs, procfs, cgroups), NVML at pynvml's C boundary, resctrl, the kubelet's
PodResources and device plugin APIs over real gRPC, NVIDIA's DRA driver's slices, and
ready-made nodes (``presets``)."""

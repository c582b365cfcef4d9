"""Check the exporter against a real GPU node: run it with the real NVML backend, scrape
it, and compare what it says with ``nvidia-smi``. Prints a pass/fail table; exits 1 on
any failure. Reads only: it changes no MIG layout, clock or other GPU setting.

    python bench/gpu_check.py            # on a machine with an NVIDIA driver

Compared: the driver version, GPU count and UUIDs, MIG slice UUIDs and each slice's
profile, frame buffer size per GPU, that GPM utilization is reported where supported,
and — under a short load on GPU 0 when PyTorch with CUDA is importable — whole-GPU
graphics activity against nvidia-smi's utilization. Then how each GPU's links answer,
asked of NVML here beside the exporter: the state of each NVLink against whether the
exporter measures them, the NVLink throughput fields (138/139, all links), GPM's NVLink
traffic (60/61) where the links are active, and NearestGpus' two calls (no other GPU: a
count of 0). Printed first: the driver branch and which of the NVML functions that
differ between branches the library exports, so one run says which of the exporter's
fallbacks this driver takes.
"""

from __future__ import annotations

import argparse
import ctypes
import re
import subprocess
import sys
import threading
import time
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MIB = 1 << 20
UTILIZATION_TOLERANCE = 0.15  # different sampling windows: NVML's vs our interval
# NVML functions some driver branches lack, which the exporter falls back from
BRANCH_SYMBOLS = (
    "nvmlDeviceGetGpuInstanceProfileInfoByIdV",  # R580 on
    "nvmlDeviceGetGpuInstanceProfileInfoV",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetNumaNodeId",  # R550 on
    "nvmlGpmQueryDeviceSupport",  # R520 on
    "nvmlGpmMigSampleGet",
    "nvmlSystemGetNVMLVersion",
)


@dataclass
class SmiGpu:
    uuid: str
    name: str
    memory_total_bytes: int
    memory_reserved_bytes: int
    mig_enabled: bool
    utilization: float | None  # 0..1; None when nvidia-smi says N/A


def parse_smi_xml(text: str) -> dict[str, SmiGpu]:
    """``nvidia-smi -q -x`` -> GPUs by UUID."""
    out = {}
    for gpu in ET.fromstring(text).iter("gpu"):
        fb = gpu.find("fb_memory_usage")
        util = gpu.findtext("utilization/gpu_util", "N/A")
        out[gpu.findtext("uuid", "").strip()] = SmiGpu(
            uuid=gpu.findtext("uuid", "").strip(),
            name=gpu.findtext("product_name", "").strip(),
            memory_total_bytes=_mib(fb.findtext("total", "0")) if fb is not None else 0,
            memory_reserved_bytes=_mib(fb.findtext("reserved", "0")) if fb is not None else 0,
            mig_enabled=gpu.findtext("mig_mode/current_mig", "").strip() == "Enabled",
            utilization=int(util.split()[0]) / 100 if util.split()[0].isdigit() else None,
        )
    return out


def parse_smi_driver(text: str) -> str:
    """``nvidia-smi -q -x`` -> the driver version."""
    return ET.fromstring(text).findtext("driver_version", "").strip()


def parse_smi_list(text: str) -> dict[str, str]:
    """``nvidia-smi -L`` -> MIG device UUID -> its profile (``MIG 1g.10gb Device 0:``)."""
    found = re.findall(r"MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[0-9a-fA-F-]+)\)", text)
    return {uuid: profile for profile, uuid in found}


def exported_symbols(library: str = "libnvidia-ml.so.1") -> dict[str, bool]:
    """Which of BRANCH_SYMBOLS the driver's NVML library exports."""
    lib = ctypes.CDLL(library)
    return {name: hasattr(lib, name) for name in BRANCH_SYMBOLS}


def compare(
    smi: dict[str, SmiGpu],
    smi_migs: dict[str, str],
    scraped: bytes,
    loaded: set[str],
    driver: str = "",
) -> list[tuple[str, str, str, bool]]:
    """(check, nvidia-smi says, numaguard says, passed) rows. ``smi_migs``: MIG UUID ->
    profile; ``loaded``: UUIDs of GPUs that ran a load while the utilization was taken;
    ``driver``: nvidia-smi's driver version, when known."""
    samples: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(scraped.decode()):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))

    def values(name: str, **match: str) -> dict[str, float]:
        return {
            labels["gpu_uuid"]: v
            for labels, v in samples.get(name, [])
            if all(labels.get(k) == want for k, want in match.items())
        }

    rows = []
    info = [labels for labels, _ in samples.get("numaguard_gpu_info", [])]
    if driver:
        got = {labels.get("driver_version", "") for labels in info}
        rows.append(("driver version", driver, ",".join(sorted(got)) or "-", got == {driver}))
    ours = values("numaguard_gpu_info")
    rows.append(("GPU count", str(len(smi)), str(len(ours)), len(smi) == len(ours)))
    rows.append(("GPU UUIDs", _short(smi), _short(ours), set(smi) == set(ours)))
    up = values("numaguard_gpu_up")
    rows.append(
        ("GPUs up", str(len(smi)), str(int(sum(up.values()))), sum(up.values()) == len(smi))
    )
    totals = values("numaguard_gpu_memory_total_bytes")
    for uuid, gpu in sorted(smi.items()):
        got = totals.get(uuid)
        # nvidia-smi may show the total with or without what the driver reserves
        ok = got is not None and any(
            abs(got - want) <= MIB
            for want in (gpu.memory_total_bytes, gpu.memory_total_bytes + gpu.memory_reserved_bytes)
        )
        rows.append(
            (
                f"memory {uuid[:12]}",
                f"{gpu.memory_total_bytes // MIB} MiB",
                "-" if got is None else f"{int(got) // MIB} MiB",
                ok,
            )
        )
    migs = {labels["mig_uuid"]: labels for labels, _ in samples.get("numaguard_mig_info", [])}
    rows.append(("MIG slice UUIDs", _short(smi_migs), _short(migs), set(migs) == set(smi_migs)))
    for uuid, profile in sorted(smi_migs.items()):
        got = migs.get(uuid, {}).get("mig_profile", "-")
        rows.append((f"profile {uuid[:16]}", profile, got, got == profile))
    supported = values("numaguard_gpu_utilization_supported", kind="sm")
    for uuid in sorted(smi):
        if supported.get(uuid) == 1:
            got = values("numaguard_gpu_utilization_ratio", kind="sm").get(uuid)
            rows.append(
                (
                    f"GPM sm {uuid[:12]}",
                    "supported",
                    "-" if got is None else f"{got:.2f}",
                    got is not None and 0 <= got <= 1,
                )
            )
        else:
            rows.append((f"GPM sm {uuid[:12]}", "-", "unsupported", uuid in supported))
    graphics = values("numaguard_gpu_utilization_ratio", kind="graphics")
    for uuid in sorted(loaded):
        want, got = smi[uuid].utilization, graphics.get(uuid)
        ok = want is not None and got is not None and abs(want - got) <= UTILIZATION_TOLERANCE
        rows.append(
            (
                f"load {uuid[:12]}",
                "-" if want is None else f"{want:.2f}",
                "-" if got is None else f"{got:.2f}",
                ok,
            )
        )
    return rows


def link_rows(n, scraped: bytes) -> list[tuple[str, str, str, bool]]:
    """(check, NVML says, numaguard says, passed) rows for each GPU's links, asked of
    NVML (``n``: pynvml, initialised) as the exporter's collection saw them."""
    from numaguard.exporter.readers import ParseError
    from numaguard.exporter.readers.nvml import ALL_LINKS, NVLINK_FIELDS, nvlink_counters

    samples: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(scraped.decode()):
        for s in family.samples:
            key = s.labels.get("gpu_uuid", "") + "/" + s.labels.get("direction", "")
            samples.setdefault(s.name, {})[key] = s.value
    rows = []
    count = n.nvmlDeviceGetCount()
    for i in range(count):
        handle = n.nvmlDeviceGetHandleByIndex(i)
        uuid = n.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        links = active = 0
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                active += bool(n.nvmlDeviceGetNvLinkState(handle, link))
            except (n.NVMLError_NotSupported, n.NVMLError_InvalidArgument):
                break  # no NVLink at all, or past its last link
            links += 1
        measured = samples.get("numaguard_gpu_nvlink_supported", {}).get(uuid + "/")
        said = f"{active} of {links} links active"
        rows.append(
            (f"nvlinks {uuid[:12]}", said, f"supported {measured}", measured == int(active > 0))
        )
        fields = n.nvmlDeviceGetFieldValues(
            handle, [(f, ALL_LINKS) for f in NVLINK_FIELDS.values()]
        )
        answers = [
            (v.fieldId, v.nvmlReturn, v.valueType, v.value.ullVal, v.timestamp) for v in fields
        ]
        try:
            counters, why = nvlink_counters(answers), ""
        except ParseError as err:
            counters, why = {}, str(err)
        codes = ",".join(str(a[1]) for a in answers)
        ok = len(counters) == len(NVLINK_FIELDS) if active else not counters
        rows.append((f"fields 138/139 {uuid[:12]}", f"codes {codes}", why or str(counters), ok))
        gpm = samples.get("numaguard_gpu_nvlink_bytes_per_second", {})
        rates = [gpm.get(f"{uuid}/{d}") for d in NVLINK_FIELDS]
        rows.append(
            (
                f"NVLink traffic {uuid[:12]}",
                "links active" if active else "no active link",
                ",".join("-" if r is None else f"{r:.3g}" for r in rates),
                all(r is not None and r >= 0 for r in rates) == bool(active),
            )
        )
        nearest = n.nvmlDeviceGetTopologyNearestGpus(handle, n.NVML_TOPOLOGY_SYSTEM)
        want = count - 1  # every other GPU is joined at SYSTEM or nearer
        rows.append(
            (f"nearest GPUs {uuid[:12]}", str(want), str(len(nearest)), len(nearest) == want)
        )
    return rows


def _mib(text: str) -> int:
    number = text.split()[0]
    return int(number) * MIB if number.isdigit() else 0


def _short(uuids) -> str:
    return ",".join(sorted(u[:12] for u in uuids)) or "-"


def _load(seconds: float) -> tuple[set[str], threading.Thread | None]:
    """Keep GPU 0 busy for a while with a matrix multiply loop, if a library can."""
    try:
        import torch

        if not torch.cuda.is_available():
            return set(), None

        def run() -> None:
            a = torch.randn(4096, 4096, device="cuda")
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()

        uuid = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
    except ImportError:
        return set(), None
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return {uuid}, thread


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--port", type=int, default=19847)
    p.add_argument("--load-seconds", type=float, default=8.0)
    args = p.parse_args()
    url = f"http://127.0.0.1:{args.port}/metrics"
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "numaguard.exporter",
            "--host-root",
            "/",
            "--gpu-backend",
            "nvml",
            "--interval",
            "1",
            "--listen",
            f"127.0.0.1:{args.port}",
            "--node-name",
            "gpu-check",
            "--log-level",
            "warning",
        ],
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        symbols = exported_symbols()
    except OSError as err:
        print(f"no NVML library: {err}")
        return 1
    for name, present in symbols.items():
        print(f"{'exports' if present else 'lacks  '}  {name}")
    try:
        loaded, thread = _load(args.load_seconds)
        time.sleep(args.load_seconds / 2 if thread else 4.0)  # cycles under the load
        scraped = urllib.request.urlopen(url, timeout=10).read()
        smi_xml = subprocess.run(
            ["nvidia-smi", "-q", "-x"], check=True, capture_output=True, text=True
        ).stdout
        smi, driver = parse_smi_xml(smi_xml), parse_smi_driver(smi_xml)
        migs = parse_smi_list(
            subprocess.run(["nvidia-smi", "-L"], check=True, capture_output=True, text=True).stdout
        )
        import pynvml

        pynvml.nvmlInit()
        try:
            links = link_rows(pynvml, scraped)
        finally:
            pynvml.nvmlShutdown()
        if thread:
            thread.join()
    finally:
        exporter.terminate()
        exporter.wait(timeout=10)
    print(f"driver {driver} (branch R{driver.split('.')[0]})")
    rows = [*compare(smi, migs, scraped, loaded, driver), *links]
    width = max(len(r[0]) for r in rows)
    print(f"{'check':<{width}}  {'nvidia-smi':<28}  {'numaguard':<28}  result")
    for check, want, got, ok in rows:
        print(f"{check:<{width}}  {want[:28]:<28}  {got[:28]:<28}  {'PASS' if ok else 'FAIL'}")
    if not loaded:
        print("(no PyTorch with CUDA here: utilization compared for support only, not under load)")
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Check the exporter against a real GPU node: run it with the real NVML backend, scrape
it, and compare what it says with ``nvidia-smi``. Prints a pass/fail table; exits 1 on
any failure. Reads only: it changes no MIG layout, clock or other GPU setting.

    python bench/gpu_check.py            # on a machine with an NVIDIA driver

Compared: GPU count and UUIDs, MIG slice UUIDs, frame buffer size per GPU, that GPM
utilization is reported where supported, and — under a short load on GPU 0 when PyTorch
with CUDA is importable — whole-GPU graphics activity against nvidia-smi's utilization.
"""

from __future__ import annotations

import argparse
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


def parse_smi_list(text: str) -> set[str]:
    """``nvidia-smi -L`` -> the MIG device UUIDs."""
    return set(re.findall(r"\(UUID: (MIG-[0-9a-fA-F-]+)\)", text))


def compare(
    smi: dict[str, SmiGpu], smi_migs: set[str], scraped: bytes, loaded: set[str]
) -> list[tuple[str, str, str, bool]]:
    """(check, nvidia-smi says, numaguard says, passed) rows. ``loaded``: UUIDs of GPUs
    that ran a load while the utilization was taken."""
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
    migs = {labels["mig_uuid"] for labels, _ in samples.get("numaguard_mig_info", [])}
    rows.append(("MIG slice UUIDs", _short(smi_migs), _short(migs), migs == smi_migs))
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
            "exporter",
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
        loaded, thread = _load(args.load_seconds)
        time.sleep(args.load_seconds / 2 if thread else 4.0)  # cycles under the load
        scraped = urllib.request.urlopen(url, timeout=10).read()
        smi = parse_smi_xml(
            subprocess.run(
                ["nvidia-smi", "-q", "-x"], check=True, capture_output=True, text=True
            ).stdout
        )
        migs = parse_smi_list(
            subprocess.run(["nvidia-smi", "-L"], check=True, capture_output=True, text=True).stdout
        )
        if thread:
            thread.join()
    finally:
        exporter.terminate()
        exporter.wait(timeout=10)
    rows = compare(smi, migs, scraped, loaded)
    width = max(len(r[0]) for r in rows)
    print(f"{'check':<{width}}  {'nvidia-smi':<28}  {'numaguard':<28}  result")
    for check, want, got, ok in rows:
        print(f"{check:<{width}}  {want[:28]:<28}  {got[:28]:<28}  {'PASS' if ok else 'FAIL'}")
    if not loaded:
        print("(no PyTorch with CUDA here: utilization compared for support only, not under load)")
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The real-GPU check script's comparison, on the fake node: nvidia-smi's answers made
from the same description agree with the exporter; a difference fails its row."""

from __future__ import annotations

import pynvml

from bench.gpu_check import compare, link_rows, parse_smi_driver, parse_smi_list, parse_smi_xml
from numaguard.exporter.sources.gpu import NvmlSource
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import MIB, FakeHostRoot
from tests.conftest import make_collection, metadata_of
from tests.helpers.gpu_node import gpu_collection


def smi_xml(nvml) -> str:
    """What nvidia-smi -q -x says of the fake GPUs (the parts the check reads)."""
    gpus = "".join(
        f"""<gpu id="{g.pci_bus_id}"><product_name>{g.model.name}</product_name>
        <uuid>{g.uuid}</uuid><mig_mode><current_mig>{"Enabled" if g.mig else "Disabled"}
        </current_mig></mig_mode><fb_memory_usage><total>{g.model.memory_mib} MiB</total>
        <reserved>0 MiB</reserved><used>0 MiB</used></fb_memory_usage>
        <utilization><gpu_util>{round(g.activity.rates.get("graphics", 0) * 100)} %</gpu_util>
        </utilization></gpu>"""
        for g in nvml.gpus
    )
    return (
        f"<nvidia_smi_log><driver_version>{nvml.branch.driver_version}</driver_version>"
        f"<attached_gpus>{len(nvml.gpus)}</attached_gpus>{gpus}</nvidia_smi_log>"
    )


def smi_list(nvml) -> str:
    lines = []
    for i, g in enumerate(nvml.gpus):
        lines.append(f"GPU {i}: {g.model.name} (UUID: {g.uuid})")
        for j, s in enumerate(g.mig or []):
            lines.append(f"  MIG {s.profile.name:<11} Device  {j}: (UUID: {s.uuid})")
    return "\n".join(lines)


async def test_the_check_passes_when_they_agree_and_fails_each_difference(fake_root):
    now = [0.0]
    host, nvml = presets.gpu_node(lambda: now[0])
    root = fake_root(host)
    with nvml.installed():
        gpus = NvmlSource(pynvml, str(root.root), clock=lambda: now[0])
        gpus.start()
        collection = make_collection(root, metadata=metadata_of(host), gpus=gpus)
        await collection.run_once()
        now[0] += 15
        await collection.run_once()
        gpus.close()
    scraped = collection.exposition.text
    smi = parse_smi_xml(smi_xml(nvml))
    driver = parse_smi_driver(smi_xml(nvml))
    migs = parse_smi_list(smi_list(nvml))
    assert len(smi) == 8 and len(migs) == 13 and driver == nvml.branch.driver_version
    assert sorted(set(migs.values())) == ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb"]
    loaded = {nvml.gpus[0].uuid}  # graphics 0.95 on both sides
    rows = compare(smi, migs, scraped, loaded, driver)
    assert all(ok for *_, ok in rows), [r for r in rows if not r[3]]
    assert len(rows) == 1 + 3 + 8 + 1 + 13 + 8 + 1

    def failed(smi_, migs_, loaded_=loaded, driver_=driver) -> set[str]:
        return {r[0] for r in compare(smi_, migs_, scraped, loaded_, driver_) if not r[3]}

    assert failed(smi, migs, driver_="999.1.2") == {"driver version"}
    slice_ = nvml.gpus[2].mig[0].uuid
    assert failed(smi, {**migs, slice_: "7g.80gb"}) == {f"profile {slice_[:16]}"}

    fewer = dict(smi)
    fewer.pop(nvml.gpus[7].uuid)
    assert {"GPU count", "GPU UUIDs", "GPUs up"} <= failed(fewer, migs)
    bigger = parse_smi_xml(smi_xml(nvml))
    bigger[nvml.gpus[3].uuid].memory_total_bytes += 2 * MIB
    assert failed(bigger, migs) == {f"memory {nvml.gpus[3].uuid[:12]}"}
    fewer_migs = {u: p for u, p in migs.items() if u != slice_}
    assert failed(smi, fewer_migs) == {"MIG slice UUIDs"}
    idle = parse_smi_xml(smi_xml(nvml))
    idle[nvml.gpus[0].uuid].utilization = 0.1
    assert failed(idle, migs) == {f"load {nvml.gpus[0].uuid[:12]}"}


async def test_the_link_checks_pass_when_nvml_and_the_exporter_agree(tmp_path):
    """On PCIe cards, two joined by an NVLink bridge: each GPU's link rows pass; a driver
    without the throughput fields fails the rows of the two that have NVLinks."""
    now = [0.0]
    host, nvml = presets.linked_gpu_node(lambda: now[0])
    root = FakeHostRoot(str(tmp_path / "host"), host)
    root.write()
    async with gpu_collection(host, nvml, root, lambda: now[0]) as (collection, _):
        await collection.run_once()
        now[0] += 15
        await collection.run_once()
        rows = link_rows(pynvml, collection.exposition.text)
        assert len(rows) == 4 * 8
        assert [r for r in rows if not r[3]] == []
        assert {r[1] for r in rows if r[0].startswith("nvlinks")} == {
            "0 of 0 links active",
            "4 of 4 links active",
        }
        nvml.fields_missing = frozenset({138, 139})
        failed = {r[0] for r in link_rows(pynvml, collection.exposition.text) if not r[3]}
    assert failed == {f"fields 138/139 {nvml.gpus[i].uuid[:12]}" for i in (4, 5)}

"""The downwardMetrics disk in vhostmd's format, as KubeVirt writes it: the metrics document
(names, types, units, contexts, order and Go's formatting), the disk's header and busy-flag
write, a reader that refuses what is not a whole disk, and values sampled from libvirt's test
driver and this host."""

from __future__ import annotations

import re
import struct
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import libvirt
import pytest

from nodeagent import downwardmetrics as dm
from nodeagent.converter import convert
from nodeagent.domxml import parse_manifest

HOST_VALUES = dict(physical_cpus=2, host_cpu_seconds=267804.88,
                   free_physical_memory_kib=2435476, free_virtual_memory_kib=19563768,
                   memory_allocated_to_virtual_servers_kib=8002064,
                   used_virtual_memory_kib=30836704, paged_in_memory_kib=17254016,
                   paged_out_memory_kib=27252776)
"""Values of KubeVirt's hostmetrics test."""


def sample(**host: object) -> dm.Sample:
    return dm.Sample(host=dm.HostSample(host_name="node01", virt_product_info="QEMU 9.0.0",
                                        time=1619008605, **host),  # type: ignore[arg-type]
                     vm_cpu_seconds=12.5, vm_vcpus=2, vm_memory_kib=2097152)


KUBEVIRT_METRICS = [
    ("HostName", "string", "host", "", "node01"),
    ("HostSystemInfo", "string", "host", "", "linux"),
    ("VirtualizationVendor", "string", "host", "", "kubevirt.io"),
    ("VirtProductInfo", "string", "host", "", "QEMU 9.0.0"),
    ("TotalCPUTime", "real64", "vm", "s", "12.500000"),
    ("ResourceProcessorLimit", "uint64", "vm", "", "2"),
    ("PhysicalMemoryAllocatedToVirtualSystem", "uint64", "vm", "KiB", "2097152"),
    ("ResourceMemoryLimit", "uint64", "vm", "KiB", "2097152"),
    ("NumberOfPhysicalCPUs", "int64", "host", "", "2"),
    ("TotalCPUTime", "real64", "host", "s", "267804.880000"),
    ("FreePhysicalMemory", "uint64", "host", "KiB", "2435476"),
    ("FreeVirtualMemory", "uint64", "host", "KiB", "19563768"),
    ("MemoryAllocatedToVirtualServers", "uint64", "host", "KiB", "8002064"),
    ("UsedVirtualMemory", "uint64", "host", "KiB", "30836704"),
    ("PagedInMemory", "uint64", "host", "KiB", "17254016"),
    ("PagedOutMemory", "uint64", "host", "KiB", "27252776"),
    ("Time", "int64", "host", "s", "1619008605"),
]
"""Name, type, context, unit and value of each metric for `sample(**HOST_VALUES)`, in
KubeVirt's order (its scraper, then its host collector)."""
GO_METRIC = """\
  <metric type="{type}" context="{context}"{unit}>
    <name>{name}</name>
    <value>{value}</value>
  </metric>
"""
"""One metric as Go's `xml.MarshalIndent(metrics, "", "  ")` lays it out."""


def test_every_metric_has_kubevirts_name_type_unit_and_context_in_its_order() -> None:
    found = dm.parse_metrics(dm.metrics_xml(sample(**HOST_VALUES)).encode())
    assert [(m.name, m.type, m.context, m.unit, m.value) for m in found] == KUBEVIRT_METRICS
    assert found == dm.metrics(sample(**HOST_VALUES))


def test_the_document_is_gos_indented_xml_and_leaves_out_what_the_host_did_not_give() -> None:
    """Byte for byte what KubeVirt marshals: attributes type, context, unit (only when set),
    two-space indent, no declaration, no final newline; without host figures, only the
    metrics that need none."""
    kept = KUBEVIRT_METRICS[:8] + KUBEVIRT_METRICS[-1:]
    assert dm.metrics_xml(sample()) == "<metrics>\n" + "".join(
        GO_METRIC.format(name=name, type=kind, context=context, value=value,
                         unit=f' unit="{unit}"' if unit else "")
        for name, kind, context, unit, value in kept) + "</metrics>"
    assert '<metric type="uint64" context="vm">\n    <name>ResourceProcessorLimit<' \
        in dm.metrics_xml(sample())


def test_text_is_escaped_as_go_escapes_it() -> None:
    odd = "a<b>&'c\"\td\x01"
    document = dm.metrics_xml(dm.Sample(host=dm.HostSample(host_name=odd, virt_product_info="",
                                                           time=0),
                                        vm_cpu_seconds=0, vm_vcpus=0, vm_memory_kib=0))
    assert "<value>a&lt;b&gt;&amp;&#39;c&#34;&#x9;d\ufffd</value>" in document
    assert dm.parse_metrics(document.encode())[0].value == "a<b>&'c\"\td\ufffd"


def header(disk: Path) -> tuple[bytes, int, int, int]:
    """The header read independently of the module: signature, flag, checksum, length."""
    signature, flag, checksum, length = struct.unpack(">4siii", disk.read_bytes()[:16])
    return signature, flag, checksum, length


def test_a_created_disk_is_256_kib_and_holds_no_metrics(tmp_path: Path) -> None:
    disk = tmp_path / "ns" / "vmi" / "metrics.img"
    dm.create_disk(str(disk))
    assert disk.stat().st_size == 262144
    assert header(disk) == (b"mvbd", 0, sum(b"<metrics></metrics>\n"), 20)
    assert dm.read_disk(str(disk)) == []


def test_written_metrics_read_back_with_header_length_and_checksum(tmp_path: Path) -> None:
    disk = tmp_path / "metrics.img"
    dm.create_disk(str(disk))
    for values in (HOST_VALUES, {}):  # the second, shorter body leaves stale bytes behind
        document = dm.metrics_xml(sample(**values))
        dm.write_disk(str(disk), document)
        body = (document + "\n").encode()
        assert header(disk) == (b"mvbd", 0, sum(body), len(body))
        assert disk.read_bytes()[16:16 + len(body)] == body
        assert dm.read_disk(str(disk)) == dm.metrics(sample(**values))
        assert disk.stat().st_size == 262144


def test_writing_never_creates_a_disk_nor_overflows_one(tmp_path: Path) -> None:
    with pytest.raises(dm.MetricsDiskError, match="not written: No such file"):
        dm.write_disk(str(tmp_path / "missing.img"), "<metrics></metrics>")
    disk = tmp_path / "metrics.img"
    dm.create_disk(str(disk))
    with pytest.raises(dm.MetricsDiskError, match="exceeds 262120"):
        dm.write_disk(str(disk), "<metrics>" + " " * 262120 + "</metrics>")
    assert dm.read_disk(str(disk)) == []


def test_a_disk_is_never_written_through_a_symlink(tmp_path: Path) -> None:
    """One planted in the disk's place after the agent checked its path (`hostpaths`) gets
    no write: creating and rewriting both refuse it, and its target is left as it was."""
    victim = tmp_path / "victim.img"
    victim.write_bytes(b"precious")
    disk = tmp_path / "metrics.img"
    disk.symlink_to(victim)
    with pytest.raises(dm.MetricsDiskError, match="not created: Too many levels"):
        dm.create_disk(str(disk))
    with pytest.raises(dm.MetricsDiskError, match="not written: Too many levels"):
        dm.write_disk(str(disk), dm.metrics_xml(sample()))
    assert victim.read_bytes() == b"precious"


def corrupt(offset: int, data: bytes) -> Callable[[Path], None]:
    def apply(disk: Path) -> None:
        raw = bytearray(disk.read_bytes())
        raw[offset:offset + len(data)] = data
        disk.write_bytes(bytes(raw))
    return apply


@pytest.mark.parametrize(("damage", "error"), [
    (lambda disk: disk.write_bytes(b"mvbd\0\0"), "6 bytes is shorter than the 16-byte"),
    (corrupt(0, b"MVBD"), "signature b'MVBD' is not b'mvbd'"),
    (corrupt(4, struct.pack(">i", 1)), "busy, its writer is updating it"),
    (corrupt(16, b"{"), "checksum is .*, the header says"),
    (corrupt(12, struct.pack(">i", 262121)), "body length 262121 is not within 0..262120"),
    (corrupt(12, struct.pack(">i", -1)), "body length -1"),
    (lambda disk: disk.write_bytes(disk.read_bytes()[:40]), "says 1080 bytes, only 24"),
    (lambda disk: disk.unlink(), "No such file"),
], ids=["short", "signature", "busy", "checksum", "too-long", "negative", "truncated",
        "missing"])
def test_the_reader_refuses_what_is_not_a_whole_disk(
        tmp_path: Path, damage: Callable[[Path], None], error: str) -> None:
    disk = tmp_path / "metrics.img"
    dm.create_disk(str(disk))
    dm.write_disk(str(disk), dm.metrics_xml(sample()))
    assert header(disk)[3] == 1080
    damage(disk)
    with pytest.raises(dm.MetricsDiskError, match=error):
        dm.read_disk(str(disk))


def test_a_checksummed_body_that_is_not_xml_is_refused(tmp_path: Path) -> None:
    disk = tmp_path / "metrics.img"
    dm.create_disk(str(disk))
    dm.write_disk(str(disk), "<metrics>")
    with pytest.raises(dm.MetricsDiskError, match="does not parse"):
        dm.read_disk(str(disk))
    dm.write_disk(str(disk), "<other></other>")
    with pytest.raises(dm.MetricsDiskError, match="root is <other>, not <metrics>"):
        dm.read_disk(str(disk))


def test_the_disk_is_the_file_the_converter_attaches(tmp_path: Path) -> None:
    vmi = {"kind": "VirtualMachineInstance", "metadata": {"name": "vm1", "namespace": "ns"},
           "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}},
                               "devices": {"disks": [{"name": "metrics",
                                                      "disk": {"bus": "virtio"}}]}},
                    "volumes": [{"name": "metrics", "downwardMetrics": {}}]}}
    spec, ctx = parse_manifest(vmi, domain_type="test", disk_dir=str(tmp_path))
    domain = ET.fromstring(convert(spec, ctx))
    attached = [s.get("file") for s in domain.iterfind("devices/disk/source")]
    assert dm.disk_paths(spec, ctx) == (str(tmp_path / "ns" / "vm1" / "metrics.img"),)
    assert attached == list(dm.disk_paths(spec, ctx))


def test_refresh_samples_the_test_driver_and_this_host(
        conn: libvirt.virConnect, domain_xml: Callable[..., str], tmp_path: Path) -> None:
    """On the test driver: its vCPU count and memory, its (clock-driven) vCPU times, and the
    host figures /proc and /sys give here."""
    name = f"dm-{uuid.uuid4().hex[:8]}"
    dom = conn.createXML(domain_xml(name=name), 0)
    try:
        disk = tmp_path / "metrics.img"
        dm.create_disk(str(disk))
        before = int(time.time())
        dm.refresh(conn, name, [str(disk)], dm.host_sample(conn, "node-a"))
        found = {(m.context, m.name): m for m in dm.read_disk(str(disk))}
    finally:
        dom.destroy()
    assert found["host", "HostName"].value == "node-a"
    assert re.fullmatch(r"QEMU \d+\.\d+\.\d+", found["host", "VirtProductInfo"].value)
    assert found["vm", "ResourceProcessorLimit"].value == "1"
    assert found["vm", "ResourceMemoryLimit"].value == str(64 * 1024)
    assert float(found["vm", "TotalCPUTime"].value) > 0
    assert int(found["host", "NumberOfPhysicalCPUs"].value) >= 1
    assert float(found["host", "TotalCPUTime"].value) > 0
    assert int(found["host", "FreePhysicalMemory"].value) > 0
    assert int(found["host", "Time"].value) >= before
    assert len(found) == 17


def test_refreshing_a_domain_that_is_gone_is_libvirts_error(
        conn: libvirt.virConnect, tmp_path: Path) -> None:
    disk = tmp_path / "metrics.img"
    dm.create_disk(str(disk))
    with pytest.raises(libvirt.libvirtError):
        dm.refresh(conn, f"gone-{uuid.uuid4().hex[:8]}", [str(disk)],
                   dm.host_sample(conn, "node-a"))
    assert dm.read_disk(str(disk)) == []

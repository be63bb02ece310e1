"""The content of a `downwardMetrics` volume: host and guest metrics in vhostmd's disk format.

As in KubeVirt (virt-launcher creates the disk, virt-handler rewrites it every few seconds),
the agent creates each disk before its guest starts and then refreshes it; a guest reads it
with vhostmd's `vm-dump-metrics`. The disk is 256 KiB: a big-endian header (signature
`mvbd`, busy flag, checksum = sum of the body's bytes, body length) and, after it, the
metrics XML. A writer sets the busy flag, fsyncs, writes the body, then clears the flag, in
place: the guest has the file open, so it is never replaced, and a reader that finds the
flag set, or a checksum that does not add up, reads again.

A disk's path is its volume's (`volume_source`), checked to lie in the VMI's own directory
(`nodeagent.hostpaths`); the agent never follows a symlink in the disk's own name, so one
planted there after that check cannot point its writes elsewhere.

The metrics are KubeVirt's, with its names, types, units and contexts, in its order.
"""

from __future__ import annotations

import glob
import os
import re
import struct
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Final

import libvirt
import msgspec

from events.api.errors import VirtbusError
from nodeagent.converter import volume_source

if TYPE_CHECKING:
    from collections.abc import Sequence

    from events.api.validation import VMISpecLike
    from nodeagent.converter import ConverterContext

DISK_SIZE: Final = 262144
"""256 KiB, the size of KubeVirt's metrics disk."""
HEADER: Final = struct.Struct(">4siii")
"""Signature, busy flag, checksum, body length; the body follows at once."""
SIGNATURE: Final = b"mvbd"
MAX_BODY: Final = DISK_SIZE - 24
"""KubeVirt's bound on the body (it keeps 24 bytes back, not just the 16 of the header)."""
OPEN_FLAGS: Final = os.O_RDWR | os.O_NOFOLLOW
"""How the agent opens a disk to write it: a symlink in its place is refused (ELOOP)."""
HOST_SYSTEM_INFO: Final = "linux"
VIRTUALIZATION_VENDOR: Final = "kubevirt.io"
"""KubeVirt's static host metrics; guests (SAP's monitoring among them) look for them."""

PROC: Final = "/proc"
CPU_TOPOLOGY: Final = "/sys/devices/system/cpu/cpu[0-9]*/topology/physical_package_id"
_GO_XML_ESCAPES: Final = {ord('"'): "&#34;", ord("'"): "&#39;", ord("&"): "&amp;",
                          ord("<"): "&lt;", ord(">"): "&gt;", ord("\t"): "&#x9;",
                          ord("\n"): "&#xA;", ord("\r"): "&#xD;"}
"""How Go's encoding/xml, which KubeVirt marshals with, escapes text."""
_NOT_XML_CHAR: Final = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


class MetricsDiskError(VirtbusError):
    """A metrics disk could not be written, or what was read is not a whole vhostmd disk."""


class Metric(msgspec.Struct, frozen=True):
    """One `<metric>` as vhostmd names it; `value` is its text."""

    name: str
    type: str
    context: str
    value: str
    unit: str = ""


class HostSample(msgspec.Struct, frozen=True, kw_only=True):
    """The host's values, the same for every guest, so sampled once per refresh round. A
    value is None where /proc or /sys did not give it; its metric is left out then, as
    KubeVirt leaves it out."""

    host_name: str
    virt_product_info: str
    physical_cpus: int | None = None
    host_cpu_seconds: float | None = None
    free_physical_memory_kib: int | None = None
    free_virtual_memory_kib: int | None = None
    memory_allocated_to_virtual_servers_kib: int | None = None
    used_virtual_memory_kib: int | None = None
    paged_in_memory_kib: int | None = None
    paged_out_memory_kib: int | None = None
    time: int


class Sample(msgspec.Struct, frozen=True, kw_only=True):
    """One guest's values for one refresh, with the host's of that round."""

    host: HostSample
    vm_cpu_seconds: float
    vm_vcpus: int
    vm_memory_kib: int


def metrics(sample: Sample) -> list[Metric]:
    """KubeVirt's metrics for `sample`: Go's float64 is `real64` ("%.6f"), uint `uint64`,
    int `int64`; the VM's memory is its balloon, which is also its limit (no ballooning)."""
    host = sample.host
    rows: list[tuple[str, str, str, str, object]] = [
        ("HostName", "string", "host", "", host.host_name),
        ("HostSystemInfo", "string", "host", "", HOST_SYSTEM_INFO),
        ("VirtualizationVendor", "string", "host", "", VIRTUALIZATION_VENDOR),
        ("VirtProductInfo", "string", "host", "", host.virt_product_info),
        ("TotalCPUTime", "real64", "vm", "s", sample.vm_cpu_seconds),
        ("ResourceProcessorLimit", "uint64", "vm", "", sample.vm_vcpus),
        ("PhysicalMemoryAllocatedToVirtualSystem", "uint64", "vm", "KiB", sample.vm_memory_kib),
        ("ResourceMemoryLimit", "uint64", "vm", "KiB", sample.vm_memory_kib),
        ("NumberOfPhysicalCPUs", "int64", "host", "", host.physical_cpus),
        ("TotalCPUTime", "real64", "host", "s", host.host_cpu_seconds),
        ("FreePhysicalMemory", "uint64", "host", "KiB", host.free_physical_memory_kib),
        ("FreeVirtualMemory", "uint64", "host", "KiB", host.free_virtual_memory_kib),
        ("MemoryAllocatedToVirtualServers", "uint64", "host", "KiB",
         host.memory_allocated_to_virtual_servers_kib),
        ("UsedVirtualMemory", "uint64", "host", "KiB", host.used_virtual_memory_kib),
        ("PagedInMemory", "uint64", "host", "KiB", host.paged_in_memory_kib),
        ("PagedOutMemory", "uint64", "host", "KiB", host.paged_out_memory_kib),
        ("Time", "int64", "host", "s", host.time),
    ]
    return [Metric(name, kind, context, f"{value:.6f}" if kind == "real64" else str(value), unit)
            for name, kind, context, unit, value in rows if value is not None]


def metrics_xml(sample: Sample) -> str:
    """The metrics document, byte for byte as KubeVirt's `xml.MarshalIndent(m, "", "  ")`."""
    return _document(metrics(sample))


def _document(items: Sequence[Metric]) -> str:
    if not items:
        return "<metrics></metrics>"
    lines = ["<metrics>"]
    for m in items:
        unit = f' unit="{m.unit}"' if m.unit else ""
        lines += [f'  <metric type="{m.type}" context="{m.context}"{unit}>',
                  f"    <name>{m.name}</name>",
                  f"    <value>{_go_escape(m.value)}</value>",
                  "  </metric>"]
    return "\n".join([*lines, "</metrics>"])


def _go_escape(text: str) -> str:
    return _NOT_XML_CHAR.sub("\ufffd", text).translate(_GO_XML_ESCAPES)


def parse_metrics(document: bytes) -> list[Metric]:
    """The metrics of a document, each field trimmed as KubeVirt's reader trims it."""
    root = ET.fromstring(document)
    if root.tag != "metrics":
        raise MetricsDiskError(f"the metrics document's root is <{root.tag}>, not <metrics>")
    return [Metric(name=(m.findtext("name") or "").strip(), type=m.get("type", "").strip(),
                   context=m.get("context", "").strip(),
                   value=(m.findtext("value") or "").strip(), unit=m.get("unit", "").strip())
            for m in root.iter("metric")]


# -- the disk -----------------------------------------------------------------------------


def create_disk(path: str) -> None:
    """A disk of `DISK_SIZE` bytes holding no metrics yet (KubeVirt's CreateDisk), so the
    guest's disk exists before it starts; an existing one is kept and emptied."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, OPEN_FLAGS | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, b"\0", DISK_SIZE - 1)
        finally:
            os.close(fd)
    except OSError as e:
        raise MetricsDiskError(f"metrics disk {path} not created: {e.strerror}") from e
    write_disk(path, _document(()))


def write_disk(path: str, document: str) -> None:
    """Write `document` into the existing disk at `path` under the busy flag (see above).
    Like KubeVirt, the body ends with a newline `vm-dump-metrics` does not add."""
    body = document.encode() + b"\n"
    if len(body) > MAX_BODY:
        raise MetricsDiskError(f"metrics body of {len(body)} bytes exceeds {MAX_BODY}")
    checksum = sum(body)
    try:
        fd = os.open(path, OPEN_FLAGS)
        try:
            os.pwrite(fd, HEADER.pack(SIGNATURE, 1, checksum, len(body)), 0)
            os.fsync(fd)
            os.pwrite(fd, body, HEADER.size)
            os.pwrite(fd, HEADER.pack(SIGNATURE, 0, checksum, len(body)), 0)
        finally:
            os.close(fd)
    except OSError as e:
        raise MetricsDiskError(f"metrics disk {path} not written: {e.strerror}") from e


def read_disk(path: str) -> list[Metric]:
    """The metrics on the disk at `path`, once its header, length and checksum hold up.
    A busy or torn disk (caught mid-write) is refused too: read it again."""
    try:
        with open(path, "rb") as disk:
            header = disk.read(HEADER.size)
            if len(header) < HEADER.size:
                raise MetricsDiskError(f"{path}: {len(header)} bytes is shorter than the "
                                       f"{HEADER.size}-byte vhostmd header")
            signature, busy, checksum, length = HEADER.unpack(header)
            if signature != SIGNATURE:
                raise MetricsDiskError(f"{path}: signature {signature!r} is not {SIGNATURE!r}: "
                                       "not a vhostmd metrics disk")
            if busy:
                raise MetricsDiskError(f"{path}: busy, its writer is updating it")
            if not 0 <= length <= MAX_BODY:
                raise MetricsDiskError(f"{path}: body length {length} is not within 0..{MAX_BODY}")
            body = disk.read(length)
    except OSError as e:
        raise MetricsDiskError(f"{path}: {e.strerror}") from e
    if len(body) != length:
        raise MetricsDiskError(f"{path}: the header says {length} bytes, only {len(body)} follow")
    if sum(body) != checksum:
        raise MetricsDiskError(f"{path}: checksum is {sum(body)}, the header says {checksum}")
    try:
        return parse_metrics(body)
    except ET.ParseError as e:
        raise MetricsDiskError(f"{path}: the metrics document does not parse: {e}") from e


# -- where the values come from -----------------------------------------------------------


def disk_paths(spec: VMISpecLike, ctx: ConverterContext) -> tuple[str, ...]:
    """The files of a VMI's downwardMetrics volumes, as the converter attaches them:
    `HostPathError` if one would lie outside the VMI's own directory."""
    return tuple(volume_source(ctx, v).path for v in spec.volumes
                 if v.downward_metrics is not None)


def refresh(conn: libvirt.virConnect, domain: str, paths: Sequence[str],
            host: HostSample) -> None:
    """Sample the running `domain` now and rewrite its metrics disks with it and `host`."""
    document = metrics_xml(sample(conn.lookupByName(domain), host))
    for path in paths:
        write_disk(path, document)


def host_sample(conn: libvirt.virConnect, host_name: str) -> HostSample:
    """The host's figures now, from /sys and /proc. VirtProductInfo is libvirt's hypervisor
    version as KubeVirt formats it ("QEMU 9.0.0"; `QEMU 0.0.2` on the test driver)."""
    version = conn.getVersion()
    major, minor, release = version // 1_000_000, version // 1000 % 1000, version % 1000
    return HostSample(host_name=host_name, virt_product_info=f"QEMU {major}.{minor}.{release}",
                      physical_cpus=_physical_cpus(), host_cpu_seconds=_host_cpu_seconds(),
                      **_host_memory(), time=int(time.time()))


def sample(dom: libvirt.virDomain, host: HostSample) -> Sample:
    """The values KubeVirt takes from virt-launcher's domain stats, from libvirt's API: vCPU
    times (`vcpus()`, 0 where unsupported), vCPU count (`info()`), and the balloon
    (`memoryStats()["actual"]`, else `info()`'s current memory, which is the same figure)."""
    _state, _max_kib, memory_kib, vcpus, _cpu_ns = dom.info()
    try:
        vcpu_ns = sum(vcpu[2] for vcpu in dom.vcpus()[0])
    except libvirt.libvirtError:
        vcpu_ns = 0
    try:
        balloon_kib = int(dom.memoryStats().get("actual", memory_kib))
    except libvirt.libvirtError:
        balloon_kib = memory_kib
    return Sample(host=host, vm_cpu_seconds=vcpu_ns / 1e9, vm_vcpus=vcpus,
                  vm_memory_kib=balloon_kib)


def _physical_cpus() -> int | None:
    """Distinct CPU packages (sockets) in /sys; None if a CPU's topology cannot be read."""
    try:
        return len({Path(p).read_text().strip() for p in glob.glob(CPU_TOPOLOGY)})
    except OSError:
        return None


def _host_cpu_seconds() -> float | None:
    """user + nice + system of /proc/stat's `cpu` line, in seconds."""
    try:
        with open(os.path.join(PROC, "stat")) as stat:
            user, nice, system = (int(t) for t in stat.readline().split()[1:4])
    except (OSError, ValueError):
        return None
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


def _host_memory() -> dict[str, int]:
    """KubeVirt's host memory and paging figures in KiB, from /proc/meminfo and
    /proc/vmstat; those a file could not give are missing."""
    out: dict[str, int] = {}
    info = _key_values("meminfo")
    if info is not None:
        free, total = info.get("MemFree", 0), info.get("MemTotal", 0)
        caches = info.get("Buffers", 0) + info.get("Cached", 0)
        swap = info.get("SwapTotal", 0) - info.get("SwapCached", 0)
        out |= {"free_physical_memory_kib": free,
                "free_virtual_memory_kib": free + info.get("SwapFree", 0),
                "memory_allocated_to_virtual_servers_kib": max(0, total - free - caches),
                "used_virtual_memory_kib": max(0, total + swap - free - caches)}
    vmstat = _key_values("vmstat")
    if vmstat is not None:
        page = os.sysconf("SC_PAGE_SIZE")
        out |= {"paged_in_memory_kib": vmstat.get("pswpin", 0) * page // 1024,
                "paged_out_memory_kib": vmstat.get("pswpout", 0) * page // 1024}
    return out


def _key_values(name: str) -> dict[str, int] | None:
    """`key value` lines of a /proc file (meminfo's keys lose their colon, values in kB)."""
    try:
        with open(os.path.join(PROC, name)) as lines:
            return {key.rstrip(":"): int(value)
                    for key, value, *_unit in (line.split() for line in lines)}
    except (OSError, ValueError):
        return None

"""Each golden manifest renders to its recorded XML, and libvirt accepts that XML.

Set VIRTBUS_UPDATE_GOLDEN=1 to rewrite the recorded XML after an intended change,
then review the diff.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

import libvirt
import pytest

from tests.converter.golden import CASES, GOLDEN_DIR, expected_xml, render_case

if TYPE_CHECKING:
    from collections.abc import Iterator

UPDATE = os.environ.get("VIRTBUS_UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("case", CASES)
def test_renders_golden_xml(case: str) -> None:
    rendered = render_case(case)
    if UPDATE:
        (GOLDEN_DIR / f"{case}.xml").write_text(rendered)
    assert rendered == expected_xml(case)


@pytest.fixture
def defined(test_driver: libvirt.virConnect) -> Iterator[list[libvirt.virDomain]]:
    domains: list[libvirt.virDomain] = []
    yield domains
    for domain in domains:
        domain.undefine()


def _probe(inside: str, devices: str = "") -> str:
    """A minimal test-driver domain with `inside` among its top-level elements."""
    return (f'<domain type="test"><name>probe</name><memory>1048576</memory>{inside}'
            f'<os><type>hvm</type></os><devices>{devices}</devices></domain>')


NEWER_LIBVIRT_CASES = {
    "hyperv-tlbflush": _probe('<features><hyperv mode="custom"><tlbflush state="on">'
                              '<direct state="on"/></tlbflush></hyperv></features>'),
    "iothreads-supplemental-pool": _probe(
        "<iothreads>1</iothreads>",
        '<disk type="file" device="disk"><driver name="qemu"><iothreads>'
        '<iothread id="1"/></iothreads></driver><source file="/p"/>'
        '<target dev="vda" bus="virtio"/></disk>'),
    "max-guest": _probe('<maxMemory unit="KiB" slots="0">2097152</maxMemory>'),
}
"""Cases using domain XML that older libvirt schemas lack: checked where libvirt takes the
probe, and skipped, saying so, where it does not."""


def _libvirt_schema_takes(conn: libvirt.virConnect, probe: str) -> bool:
    try:
        conn.defineXMLFlags(probe, libvirt.VIR_DOMAIN_DEFINE_VALIDATE).undefine()
    except libvirt.libvirtError:
        return False
    return True


@pytest.mark.parametrize("case", CASES)
def test_libvirt_accepts_golden_xml(
    case: str, test_driver: libvirt.virConnect, defined: list[libvirt.virDomain]
) -> None:
    probe = NEWER_LIBVIRT_CASES.get(case)
    if probe is not None and not _libvirt_schema_takes(test_driver, probe):
        pytest.skip(f"this libvirt's domain schema predates what {case} renders")
    xml = expected_xml(case)
    domain = test_driver.defineXMLFlags(xml, libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
    defined.append(domain)
    root = ET.fromstring(xml)
    _state, max_memory_kib, _memory, vcpus, _cpu_time = domain.info()
    assert domain.name() == root.findtext("name")
    assert domain.vcpusFlags(libvirt.VIR_DOMAIN_VCPU_MAXIMUM) == int(root.findtext("vcpu", ""))
    assert vcpus == _vcpus_at_boot(root)
    assert max_memory_kib == int(root.findtext("memory", "")) // 1024


def _vcpus_at_boot(root: ET.Element) -> int:
    """`<vcpu>`, or with CPU hot-plug the `<vcpus>` entries enabled at boot."""
    hotplug = root.find("vcpus")
    if hotplug is None:
        return int(root.findtext("vcpu", ""))
    return sum(vcpu.get("enabled") == "yes" for vcpu in hotplug)

"""virtbus's domain against KubeVirt's own converter golden (its converter's
`testdata/domain_x86_64.xml`, parts kept verbatim under `kubevirt/`): same VMI, same guest.

The element order and spelling differ (`<smm/>` vs `<smm state="on"/>`), so both are
compared as libvirt reads them: the virtbus domain is defined as rendered and again with
KubeVirt's element in place of its own, and libvirt's dumps of that element must be equal.
"""

from __future__ import annotations

import pathlib
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

import pytest

from tests.converter.golden import render_case

if TYPE_CHECKING:
    import libvirt

KUBEVIRT_DIR = pathlib.Path(__file__).parent / "kubevirt"
CASE = "features-kubevirt-converter-test"
"""The golden case whose manifest is the VMI of KubeVirt's converter_test.go amd64 domain."""


def _dumped(conn: libvirt.virConnect, domain: ET.Element, tag: str) -> str:
    """`<tag>` of `domain` as libvirt writes it back once defined."""
    defined = conn.defineXML(ET.tostring(domain, encoding="unicode"))
    try:
        element = ET.fromstring(defined.XMLDesc()).find(tag)
    finally:
        defined.undefine()
    assert element is not None
    return ET.tostring(element, encoding="unicode")


def _kubevirt_element(file_name: str) -> ET.Element:
    return ET.fromstring((KUBEVIRT_DIR / file_name).read_text())


def test_features_are_kubevirts(test_driver: libvirt.virConnect) -> None:
    """ACPI, vmport off and spinlocks retries 4096 where the VMI wrote no count."""
    ours = ET.fromstring(render_case(CASE))
    theirs = ET.fromstring(render_case(CASE))
    features = theirs.find("features")
    assert features is not None
    theirs[list(theirs).index(features)] = _kubevirt_element("domain_x86_64_features.xml")
    assert _dumped(test_driver, ours, "features") == _dumped(test_driver, theirs, "features")


@pytest.mark.parametrize("case", ["minimal", CASE])
def test_every_vmi_has_kubevirts_guest_agent_channel(case: str) -> None:
    kubevirt = _kubevirt_element("domain_x86_64_guest_agent_channel.xml")
    channels = ET.fromstring(render_case(case)).findall("devices/channel")
    rendered = [(c.attrib, [(t.tag, t.attrib) for t in c]) for c in channels]
    assert (kubevirt.attrib, [(t.tag, t.attrib) for t in kubevirt]) in rendered

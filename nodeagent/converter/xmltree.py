"""ElementTree helpers shared by the configurators, and the one place XML is serialised."""

from __future__ import annotations

import xml.etree.ElementTree as ET

Element = ET.Element

DOMAIN_ORDER = (
    "name",
    "uuid",
    "metadata",
    "maxMemory",
    "memory",
    "memoryBacking",
    "vcpu",
    "iothreads",
    "vcpus",
    "sysinfo",
    "os",
    "features",
    "cpu",
    "clock",
    "devices",
)
"""Libvirt's own order of top-level elements, so output reads like `virsh dumpxml`."""


def sub(parent: Element, tag: str, text: str | int | None = None, **attrs: str | int) -> Element:
    """Append `<tag attrs>text</tag>` to parent; attribute values are stringified in order."""
    element = ET.SubElement(parent, tag, {k: str(v) for k, v in attrs.items()})
    if text is not None:
        element.text = str(text)
    return element


def child(parent: Element, tag: str) -> Element:
    """The first `<tag>` under parent, created if missing: configurators share `<devices>`."""
    found = parent.find(tag)
    return found if found is not None else sub(parent, tag)


def yes_no(value: bool | None, default: bool) -> str:
    return "yes" if (default if value is None else value) else "no"


def on_off(value: bool | None, default: bool) -> str:
    return "on" if (default if value is None else value) else "off"


def render(domain: Element) -> str:
    """Deterministic, indented XML text with top-level elements in libvirt's order."""
    domain[:] = sorted(domain, key=lambda e: DOMAIN_ORDER.index(e.tag))
    ET.indent(domain, space="  ")
    return ET.tostring(domain, encoding="unicode") + "\n"

"""`<os><type>`: architecture and machine type (chipset)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodeagent.converter import defaults
from nodeagent.converter.xmltree import child, sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def configure_machine(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    """`spec.domain.machine.type`, q35 when unset."""
    machine = spec.domain.machine
    machine_type = machine.type if machine is not None and machine.type else defaults.MACHINE_TYPE
    sub(child(domain, "os"), "type", defaults.OS_TYPE, arch=defaults.ARCH, machine=machine_type)

"""`<input>` devices: tablets, on USB unless the spec asks for virtio (seed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodeagent.converter import defaults
from nodeagent.converter.xmltree import child, sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def configure_inputs(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    for device in spec.domain.devices.inputs:
        element = sub(
            child(domain, "devices"),
            "input",
            type=device.type,
            bus=device.bus or defaults.INPUT_BUS,
        )
        sub(element, "alias", name=f"ua-{device.name}")

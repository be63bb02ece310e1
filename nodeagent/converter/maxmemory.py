"""`<maxMemory>`: the ceiling memory may be hot-plugged up to (`memory.maxGuest`).

As KubeVirt's MemoryConfigurator: only when `maxGuest` differs from the guest memory, in
bytes, with no DIMM slots (KubeVirt hot-plugs virtio-mem, which needs none). virtbus does
not hot-plug memory yet: the guest starts with `memory.guest` and keeps it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from events.api.resources import guest_memory_bytes, quantity
from nodeagent.converter.xmltree import sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def configure_max_memory(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    memory = spec.domain.memory
    if memory is None or memory.max_guest is None:
        return
    ceiling = int(quantity(memory.max_guest))
    if ceiling != guest_memory_bytes(spec.domain):
        sub(domain, "maxMemory", ceiling, unit="b", slots=0)

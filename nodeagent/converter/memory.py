"""`<memory>` and `<memoryBacking>`: guest RAM size and what backs it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from events.api.resources import guest_memory_bytes, hugepage_size, quantity
from nodeagent.converter.xmltree import sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def configure_memory(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    """Guest memory from `memory.guest`, else requests, else limits (events.api.resources)."""
    sub(domain, "memory", guest_memory_bytes(spec.domain), unit="b")
    page_size = hugepage_size(spec.domain)
    if page_size:
        hugepages = sub(sub(domain, "memoryBacking"), "hugepages")
        sub(hugepages, "page", size=int(quantity(page_size)) // 1024, unit="KiB")

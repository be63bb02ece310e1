"""`<memory>` and `<memoryBacking>`: guest RAM size and what backs it.

Hugepages are KubeVirt's `<hugepages>` with a memfd source (QEMU's memory-backend-memfd,
which KubeVirt uses on amd64 unless the VMI's `kubevirt.io/memfd` annotation is "false").
The page size is written too: KubeVirt's launcher pod mounts only the requested size, so
libvirt's default is that size; a virtbus host has no such mount, so it is said here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from events.api.resources import guest_memory_bytes, hugepage_size, quantity
from nodeagent.converter.xmltree import sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def memfd_backed(spec: VMISpecLike, ctx: ConverterContext) -> bool:
    """Whether guest memory is a memfd (hugepages, unless the VMI opted out)."""
    return bool(hugepage_size(spec.domain)) and ctx.memfd


def configure_memory(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    """Guest memory from `memory.guest`, else requests, else limits (events.api.resources)."""
    sub(domain, "memory", guest_memory_bytes(spec.domain), unit="b")
    page_size = hugepage_size(spec.domain)
    if page_size:
        backing = sub(domain, "memoryBacking")
        hugepages = sub(backing, "hugepages")
        sub(hugepages, "page", size=int(quantity(page_size)) // 1024, unit="KiB")
        if memfd_backed(spec, ctx):
            sub(backing, "source", type="memfd")

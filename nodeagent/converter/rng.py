"""`<rng>` and `<memballoon>`: the small virtio devices KubeVirt adds by flag."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodeagent.converter import defaults
from nodeagent.converter.xmltree import child, sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def configure_rng(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    """`rng: {}` gives the guest host entropy through virtio-rng."""
    if spec.domain.devices.rng is None:
        return
    rng = sub(child(domain, "devices"), "rng", model="virtio")
    sub(rng, "backend", defaults.RNG_BACKEND, model="random")


def configure_balloon(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    """A virtio balloon for memory statistics unless `autoattachMemBalloon: false`."""
    off = spec.domain.devices.autoattach_mem_balloon is False
    sub(child(domain, "devices"), "memballoon", model="none" if off else "virtio")

"""What KubeVirt admits but no virtbus node can give a guest: the launch fails, naming it.

A domain without the device, or with its memory not where the spec pinned it, would be a
different machine than the one asked for, so the agent does not start one. Its launch fails
with `NotOnThisNode`, whose message is the VMI's Failed reason (`launch failed: …`). The
list of such needs, and why, is `events.api.unsupported`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from events.api.errors import VirtbusError
from events.api.unsupported import unmet_needs

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


class NotOnThisNode(VirtbusError):
    """The VMI is valid, but this node cannot run it as specified."""


def refuse_unmet_needs(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    """First in the pipeline: nothing is rendered for a guest this node cannot run."""
    unmet = list(unmet_needs(spec))
    if unmet:
        raise NotOnThisNode("; ".join(unmet))

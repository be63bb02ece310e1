"""`<name>` and `<uuid>`: how libvirt and the guest tell this domain apart."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodeagent.converter.xmltree import sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def configure_identity(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    """Name `<namespace>_<name>`; UUID from `firmware.uuid`, else the VMI's uid.

    KubeVirt's webhook always fills `firmware.uuid`; the uid is our stand-in so a
    domain keeps one UUID across restarts and migrations.
    """
    sub(domain, "name", ctx.domain_name)
    firmware = spec.domain.firmware
    uuid = firmware.uuid if firmware is not None and firmware.uuid else ctx.uid
    if uuid:
        sub(domain, "uuid", uuid)

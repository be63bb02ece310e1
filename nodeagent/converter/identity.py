"""`<name>`, `<uuid>` and `<metadata>`: how libvirt, the guest and the agent tell this
domain apart."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

from nodeagent.converter.xmltree import sub

VMI_METADATA_NS = "urn:virtbus:vmi:1"
VMI_METADATA_TAG = f"{{{VMI_METADATA_NS}}}vmi"
ET.register_namespace("virtbus", VMI_METADATA_NS)
"""So rendered XML reads `<virtbus:vmi>`, not `<ns0:vmi>`."""

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
    if ctx.uid:
        # The agent finds the VMI of a domain here after a restart, even when the domain
        # uuid is the guest's firmware.uuid rather than the VMI's uid.
        metadata = sub(domain, "metadata")
        installation = {"installation": ctx.installation} if ctx.installation else {}
        sub(metadata, VMI_METADATA_TAG, uid=ctx.uid, namespace=ctx.namespace, name=ctx.name,
            **installation)

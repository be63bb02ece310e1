"""`<watchdog>`: the i6300esb timer the guest must keep feeding, and what happens when it
stops (KubeVirt's defaulting makes an action-less watchdog `reset`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodeagent.converter import defaults
from nodeagent.converter.xmltree import child, sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def configure_watchdog(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    watchdog = spec.domain.devices.watchdog
    if watchdog is None:
        return
    action = watchdog.i6300esb.action if watchdog.i6300esb is not None else ""
    element = sub(child(domain, "devices"), "watchdog", model=defaults.WATCHDOG_MODEL,
                  action=action or defaults.WATCHDOG_ACTION)
    sub(element, "alias", name=f"ua-{watchdog.name}")

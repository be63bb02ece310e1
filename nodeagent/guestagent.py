"""The QEMU guest agent's channel (`org.qemu.guest_agent.0`), as libvirt sees it.

Every guest has the channel (`nodeagent.converter.channels`); libvirt says when the agent in
the guest opens or closes it (its agent lifecycle event), and the domain XML says whether it
is open now (`<target ... state='connected'/>`). The node agent reports both, so the VMI
carries KubeVirt's `AgentConnected` condition while a guest agent listens.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import NamedTuple

import libvirt
import structlog

from nodeagent.converter.defaults import GUEST_AGENT_CHANNEL
from nodeagent.phases import GuestPhase, Verdict, judge
from nodeagent.virterror import is_no_domain

log = structlog.get_logger(__name__)


class AgentChange(NamedTuple):
    """The guest agent of domain `name` connected or disconnected."""

    name: str
    connected: bool


def agent_connected(dom: libvirt.virDomain) -> bool:
    """Whether the guest agent's channel of `dom` is open now (libvirt's live XML)."""
    target = ET.fromstring(dom.XMLDesc(0)).find(
        f"devices/channel/target[@name='{GUEST_AGENT_CHANNEL}']")
    return target is not None and target.get("state") == "connected"


def running_verdict(conn: libvirt.virConnect, name: str) -> Verdict | None:
    """What the guest's state says now, if it runs (a change is reported with it, so a
    report of the agent does not contradict a pause); None once it stopped or went."""
    try:
        verdict = judge(*conn.lookupByName(name).state())
    except libvirt.libvirtError as err:
        if is_no_domain(err):
            return None
        raise
    return verdict if verdict.phase is GuestPhase.RUNNING else None


class GuestAgentWatcher:
    """Hands each change of a guest agent's channel that the guest made (libvirt's reason
    CHANNEL) to `deliver`, on libvirt's event thread (`deliver` must not block). The state
    libvirt announces as a domain starts (reason DOMAIN_STARTED: not connected, its vCPUs not
    yet running) says nothing new and is not handed on: read then, the guest's state would
    be the paused one of its start."""

    def __init__(self, conn: libvirt.virConnect,
                 deliver: Callable[[AgentChange], object]) -> None:
        self._conn, self._deliver = conn, deliver
        self._callback_id: int = conn.domainEventRegisterAny(
            None, libvirt.VIR_DOMAIN_EVENT_ID_AGENT_LIFECYCLE, self._on_event, None)

    def close(self) -> None:
        self._conn.domainEventDeregisterAny(self._callback_id)

    def _on_event(self, _conn: libvirt.virConnect, dom: libvirt.virDomain, state: int,
                  reason: int, _: None) -> None:
        if reason != libvirt.VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_REASON_CHANNEL:
            return
        connected = state == libvirt.VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_STATE_CONNECTED
        try:
            self._deliver(AgentChange(dom.name(), connected))
        except Exception:
            log.exception("delivering a guest agent change failed", domain=dom.name())

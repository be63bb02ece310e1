"""Guest lifecycle on a libvirt connection: every operation is safe to repeat.

An agent that restarts, or receives a command twice, calls these again; they look at the
domain first and never launch, stop or pause it a second time. Stops record their cause
with the `LifecycleWatcher` before acting, so the STOPPED event they cause maps to the
right phase (see `nodeagent.phases.phase_for`).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from enum import StrEnum
from typing import TYPE_CHECKING

import libvirt
import structlog

from events.api.errors import Conflict, InvalidSpec, NotFound
from nodeagent.phases import GuestPhase, StopCause, judge
from nodeagent.virterror import is_no_domain, is_unsupported, is_unsupported_flags

if TYPE_CHECKING:
    from nodeagent.phases import Observation, Verdict
    from nodeagent.watcher import LifecycleWatcher

log = structlog.get_logger(__name__)


class StopOutcome(StrEnum):
    """How `graceful_stop` ended, for the stop report."""

    ALREADY_GONE = "AlreadyGone"
    ALREADY_STOPPED = "AlreadyStopped"
    SHUT_DOWN = "ShutDown"
    DESTROYED = "Destroyed"


def define_and_start(conn: libvirt.virConnect, xml: str, *,
                     paused: bool = False) -> libvirt.virDomain:
    """Define the domain and start it, unless a domain of that name already runs; `paused`
    starts its vCPUs suspended (KubeVirt's `startStrategy: Paused`).

    A running domain is left alone even if `xml` differs: an agent restart must never
    launch a guest twice. The same name with another uuid is a different VMI: refused.
    """
    root = ET.fromstring(xml)
    name = root.findtext("name", "")
    if not name:
        raise InvalidSpec("domain.name", "the domain XML must name the domain")
    uuid = root.findtext("uuid", "").lower()
    existing = _lookup(conn, name)
    if existing is not None and uuid and existing.UUIDString() != uuid:
        raise Conflict(f"domain {name!r} exists with uuid {existing.UUIDString()}, not {uuid}")
    if existing is not None and existing.isActive():
        log.info("domain already running", domain=name)
        return existing
    dom = conn.defineXML(xml)
    try:
        _create(dom, paused=paused)
    except libvirt.libvirtError:
        if not dom.isActive():
            raise
    log.info("domain started", domain=name, uuid=dom.UUIDString(), paused=paused)
    return dom


def _create(dom: libvirt.virDomain, *, paused: bool) -> None:
    if not paused:
        dom.create()
        return
    try:
        dom.createWithFlags(libvirt.VIR_DOMAIN_START_PAUSED)
    except libvirt.libvirtError as err:
        if not is_unsupported_flags(err):
            raise
        # libvirt's test driver cannot start paused; its guests run no code, so a guest
        # suspended straight after its start is the same guest.
        dom.create()
        dom.suspend()


def graceful_stop(
    conn: libvirt.virConnect, name: str, grace_seconds: int, watcher: LifecycleWatcher
) -> StopOutcome:
    """ACPI shutdown, destroy once `grace_seconds` pass without the guest stopping, undefine.

    A grace period of 0 destroys at once, as KubeVirt does for a forced stop.
    """
    dom = _lookup(conn, name)
    if dom is None:
        return StopOutcome.ALREADY_GONE
    watcher.expect(name, StopCause.REQUESTED)
    try:
        outcome = (
            _stop(dom, grace_seconds, watcher) if dom.isActive() else StopOutcome.ALREADY_STOPPED
        )
        _undefine(dom)
    except libvirt.libvirtError as err:
        watcher.forget(name)
        if is_no_domain(err):
            return StopOutcome.ALREADY_GONE
        raise
    if outcome is StopOutcome.ALREADY_STOPPED:
        watcher.forget(name)
    log.info("domain stopped", domain=name, outcome=outcome)
    return outcome


def _stop(dom: libvirt.virDomain, grace_seconds: int, watcher: LifecycleWatcher) -> StopOutcome:
    if grace_seconds > 0:
        dom.shutdown()
        if watcher.wait_until(lambda: not dom.isActive(), grace_seconds):
            return StopOutcome.SHUT_DOWN
        log.info("grace period over, destroying", domain=dom.name(), grace=grace_seconds)
    try:
        dom.destroy()
    except libvirt.libvirtError:
        if dom.isActive():
            raise
        return StopOutcome.SHUT_DOWN
    return StopOutcome.DESTROYED


def _undefine(dom: libvirt.virDomain) -> None:
    """Remove the definition, with its UEFI variable store when it has one."""
    if not dom.isPersistent():
        return
    has_nvram = ET.fromstring(dom.XMLDesc(0)).find("os/nvram") is not None
    dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM if has_nvram else 0)


def pause(conn: libvirt.virConnect, name: str) -> None:
    """Suspend the guest's vCPUs; pausing a paused guest does nothing."""
    dom = require(conn, name)
    if dom.state()[0] != libvirt.VIR_DOMAIN_PAUSED:
        dom.suspend()
        log.info("domain paused", domain=name)


def unpause(conn: libvirt.virConnect, name: str) -> None:
    """Resume a paused guest; resuming a running guest does nothing."""
    dom = require(conn, name)
    if dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
        dom.resume()
        log.info("domain unpaused", domain=name)


def restart(
    conn: libvirt.virConnect, name: str, watcher: LifecycleWatcher, *, hard: bool = False
) -> None:
    """Reboot the guest; `hard`, or a driver without reboot, power-cycles it instead.

    The power cycle's STOPPED event carries `StopCause.RESTART`, so it changes no phase.
    """
    dom = require(conn, name)
    if not hard:
        try:
            dom.reboot(0)
        except libvirt.libvirtError as err:
            if not is_unsupported(err):
                raise
        else:
            log.info("domain rebooted", domain=name)
            return
    watcher.expect(name, StopCause.RESTART)
    try:
        dom.destroy()
    except libvirt.libvirtError:
        watcher.forget(name)
        raise
    dom.create()
    log.info("domain power-cycled", domain=name)


def verdict_now(conn: libvirt.virConnect, obs: Observation) -> Verdict:
    """What an event that leaves the guest running means by the time it is reported: the
    guest's pause state now, since later events may have changed it (a guest started paused
    is STARTED, then SUSPENDED, and its STARTED must not report it unpaused). The event's
    own verdict when the domain is gone, stopped, or cannot be asked."""
    try:
        dom = _lookup(conn, obs.name)
        if dom is None:
            return obs.verdict
        state, reason = dom.state()
    except libvirt.libvirtError:
        return obs.verdict
    now = judge(state, reason, obs.cause)
    return now if now.phase is GuestPhase.RUNNING else obs.verdict


def _lookup(conn: libvirt.virConnect, name: str) -> libvirt.virDomain | None:
    try:
        return conn.lookupByName(name)
    except libvirt.libvirtError as err:
        if is_no_domain(err):
            return None
        raise


def require(conn: libvirt.virConnect, name: str) -> libvirt.virDomain:
    """The domain of that name; `NotFound` when the host has none."""
    dom = _lookup(conn, name)
    if dom is None:
        raise NotFound(f"domain {name!r} is not defined on this host")
    return dom

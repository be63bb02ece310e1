"""From libvirt lifecycle events and domain states to VMI phases, as virt-handler decides.

Two tables. `event_state` turns a lifecycle event into the domain state it leaves behind,
so events and states found after an agent restart go through one decision, `phase_for`.
libvirt alone cannot tell "we destroyed it" from "someone killed it", so the caller
passes the `StopCause` it recorded when it asked (see `LifecycleWatcher.expect`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

import libvirt

from events.language.kinds.vm import PAUSED_IO_ERROR


class GuestPhase(StrEnum):
    """The VMI phases a node can observe (names as in KubeVirt's `status.phase`)."""

    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


FINISHED = frozenset({GuestPhase.SUCCEEDED, GuestPhase.FAILED})
"""The phases a VMI never leaves."""


class StopCause(StrEnum):
    """Why a domain is about to stop (or pause), recorded before it does so its event can be
    judged."""

    REQUESTED = "requested"
    """Our stop (graceful shutdown, or destroy after the grace period)."""
    RESTART = "restart"
    """Our power cycle; the domain starts again at once."""
    GUEST_SHUTDOWN = "guest shutdown"
    """A simulated guest-initiated poweroff (test driver)."""
    GUEST_CRASH = "guest crash"
    """A simulated guest crash (test driver, where destroy stands in for it)."""
    IO_ERROR = "io error"
    """A simulated disk I/O error that pauses the guest (test driver, where suspend stands
    in for it)."""

    @property
    def ends_with(self) -> int:
        """The lifecycle event that carries this cause: a suspend for an I/O error, else
        the stop."""
        ends: int = (libvirt.VIR_DOMAIN_EVENT_SUSPENDED if self is StopCause.IO_ERROR
                     else libvirt.VIR_DOMAIN_EVENT_STOPPED)
        return ends


class Observation(NamedTuple):
    """One lifecycle event on this host, with the cause we recorded for it, if any."""

    name: str
    uuid: str
    event: int
    detail: int
    cause: StopCause | None = None

    @property
    def verdict(self) -> Verdict:
        """What this event says of the guest (see `judge`); nothing for define/undefine."""
        state = event_state(self.event, self.detail)
        return Verdict(None) if state is None else judge(*state, self.cause)

    @property
    def phase(self) -> GuestPhase | None:
        """The VMI phase this event implies, or None when it implies no change."""
        return self.verdict.phase

    @property
    def paused(self) -> bool:
        """The event leaves the guest's vCPUs suspended (still Running, with KubeVirt's
        Paused condition)."""
        return self.verdict.paused

    @property
    def paused_reason(self) -> str:
        """KubeVirt's Paused reason when the hypervisor paused the guest; '' otherwise."""
        return self.verdict.paused_reason

    @property
    def reason(self) -> str:
        """Why the guest stopped, for its VMI's `status.reason`: the cause we recorded, else
        what libvirt says of a stop nobody here asked for (`LIBVIRT_STOP_REASONS`)."""
        if self.cause is not None:
            return str(self.cause)
        return LIBVIRT_STOP_REASONS.get((self.event, self.detail), "")


LIBVIRT_STOP_REASONS = {
    (libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN):
        str(StopCause.GUEST_SHUTDOWN),
    (libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_CRASHED):
        str(StopCause.GUEST_CRASH),
    (libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_FAILED):
        "QEMU ended unexpectedly (killed or failed)",
    (libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_DESTROYED):
        "destroyed outside virtbus",
    (libvirt.VIR_DOMAIN_EVENT_CRASHED, libvirt.VIR_DOMAIN_EVENT_CRASHED_PANICKED):
        "guest panicked",
    (libvirt.VIR_DOMAIN_EVENT_CRASHED, libvirt.VIR_DOMAIN_EVENT_CRASHED_CRASHLOADED):
        "guest panicked (a crash kernel was loaded)",
}
"""What a lifecycle event (event, detail) nobody here caused says of why the guest stopped:
libvirt's own words for a real host's guest powering off, crashing, or its QEMU process
killed (libvirt reports a QEMU gone without a word as STOPPED, FAILED)."""


class Verdict(NamedTuple):
    """What a domain's (state, reason) says of its guest, as a node reports it."""

    phase: GuestPhase | None
    """The VMI phase, or None when it implies no change (see `phase_for`)."""
    paused: bool = False
    """The guest's vCPUs are suspended (still Running, with KubeVirt's Paused condition)."""
    paused_reason: str = ""
    """KubeVirt's Paused reason (see `paused_reason`)."""


def judge(state: int, reason: int, cause: StopCause | None = None) -> Verdict:
    """Phase, pause and Paused reason of a domain in `state` for `reason`, given the cause
    we recorded: the one rule for lifecycle events and for states found at agent start."""
    return Verdict(phase_for(state, reason, cause), state == libvirt.VIR_DOMAIN_PAUSED,
                   paused_reason(state, reason, cause))


def event_state(event: int, detail: int) -> tuple[int, int] | None:
    """The (state, reason) a lifecycle event leaves; None for define/undefine.

    | event              | detail          | state        | reason            |
    |--------------------|-----------------|--------------|-------------------|
    | STARTED, RESUMED   | any             | RUNNING      | detail unused     |
    | SUSPENDED          | PAUSED          | PAUSED       | PAUSED_USER       |
    | SUSPENDED          | IOERROR         | PAUSED       | PAUSED_IOERROR    |
    | SUSPENDED          | other           | PAUSED       | (unknown)         |
    | PMSUSPENDED        | any             | PMSUSPENDED  |                   |
    | SHUTDOWN           | any             | SHUTDOWN     | (shutting down)   |
    | CRASHED            | any             | CRASHED      |                   |
    | STOPPED            | SHUTDOWN ...    | SHUTOFF      | SHUTOFF_<detail>  |
    | DEFINED, UNDEFINED | any             | -            | no state change   |

    STOPPED details are the shutoff reasons shifted by one (reason 0 is "unknown").
    """
    match event:
        case libvirt.VIR_DOMAIN_EVENT_STARTED | libvirt.VIR_DOMAIN_EVENT_RESUMED:
            return libvirt.VIR_DOMAIN_RUNNING, 0
        case libvirt.VIR_DOMAIN_EVENT_SUSPENDED:
            return libvirt.VIR_DOMAIN_PAUSED, _SUSPENDED_REASONS.get(detail, 0)
        case libvirt.VIR_DOMAIN_EVENT_PMSUSPENDED:
            return libvirt.VIR_DOMAIN_PMSUSPENDED, 0
        case libvirt.VIR_DOMAIN_EVENT_SHUTDOWN:
            return libvirt.VIR_DOMAIN_SHUTDOWN, 0
        case libvirt.VIR_DOMAIN_EVENT_CRASHED:
            return libvirt.VIR_DOMAIN_CRASHED, 0
        case libvirt.VIR_DOMAIN_EVENT_STOPPED:
            return libvirt.VIR_DOMAIN_SHUTOFF, detail + 1
        case _:
            return None


_SUSPENDED_REASONS = {
    libvirt.VIR_DOMAIN_EVENT_SUSPENDED_PAUSED: libvirt.VIR_DOMAIN_PAUSED_USER,
    libvirt.VIR_DOMAIN_EVENT_SUSPENDED_IOERROR: libvirt.VIR_DOMAIN_PAUSED_IOERROR,
}


def paused_reason(state: int, reason: int, cause: StopCause | None = None) -> str:
    """KubeVirt's Paused reason for a domain the hypervisor paused; '' for any other pause
    (a user's: the control plane knows it asked)."""
    io_error = reason == libvirt.VIR_DOMAIN_PAUSED_IOERROR or cause is StopCause.IO_ERROR
    return PAUSED_IO_ERROR if state == libvirt.VIR_DOMAIN_PAUSED and io_error else ""


def phase_for(state: int, reason: int, cause: StopCause | None = None) -> GuestPhase | None:
    """The VMI phase of a domain in `state` for `reason`, given the cause we recorded.

    | state                               | reason               | cause          | phase     |
    |-------------------------------------|----------------------|----------------|-----------|
    | RUNNING, PAUSED, BLOCKED, PMSUSPEND | any                  | any            | Running   |
    | SHUTDOWN (shutting down)            | any                  | any            | no change |
    | CRASHED                             | any                  | any            | Failed    |
    | SHUTOFF                             | any                  | RESTART        | no change |
    | SHUTOFF                             | any                  | GUEST_CRASH    | Failed    |
    | SHUTOFF                             | CRASHED, FAILED      | any            | Failed    |
    | SHUTOFF                             | SHUTDOWN (guest/ACPI)| any            | Succeeded |
    | SHUTOFF                             | DESTROYED            | REQUESTED      | Succeeded |
    | SHUTOFF                             | DESTROYED            | none           | Failed    |
    | SHUTOFF                             | SAVED, FROM_SNAPSHOT | any            | Succeeded |
    | anything else (MIGRATED, unknown)   |                      |                | no change |

    Migrated-away domains are the migration controller's to judge, not this table's.
    """
    match state, reason, cause:
        case (
            libvirt.VIR_DOMAIN_RUNNING
            | libvirt.VIR_DOMAIN_PAUSED
            | libvirt.VIR_DOMAIN_BLOCKED
            | libvirt.VIR_DOMAIN_PMSUSPENDED,
            _,
            _,
        ):
            return GuestPhase.RUNNING
        case libvirt.VIR_DOMAIN_SHUTDOWN, _, _:
            return None
        case libvirt.VIR_DOMAIN_CRASHED, _, _:
            return GuestPhase.FAILED
        case libvirt.VIR_DOMAIN_SHUTOFF, _, StopCause.RESTART:
            return None
        case libvirt.VIR_DOMAIN_SHUTOFF, _, StopCause.GUEST_CRASH:
            return GuestPhase.FAILED
        case (
            libvirt.VIR_DOMAIN_SHUTOFF,
            libvirt.VIR_DOMAIN_SHUTOFF_CRASHED | libvirt.VIR_DOMAIN_SHUTOFF_FAILED,
            _,
        ):
            return GuestPhase.FAILED
        case libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTOFF_SHUTDOWN, _:
            return GuestPhase.SUCCEEDED
        case libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTOFF_DESTROYED, StopCause.REQUESTED:
            return GuestPhase.SUCCEEDED
        case libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTOFF_DESTROYED, _:
            return GuestPhase.FAILED
        case (
            libvirt.VIR_DOMAIN_SHUTOFF,
            libvirt.VIR_DOMAIN_SHUTOFF_SAVED | libvirt.VIR_DOMAIN_SHUTOFF_FROM_SNAPSHOT,
            _,
        ):
            return GuestPhase.SUCCEEDED
        case _:
            return None

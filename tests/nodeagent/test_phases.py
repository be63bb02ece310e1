"""Every row of the event/state -> VMI phase tables."""

from __future__ import annotations

import libvirt as lv
import pytest

from nodeagent.phases import (
    GuestPhase,
    Observation,
    StopCause,
    Verdict,
    judge,
    paused_reason,
    phase_for,
)

RUNNING, SUCCEEDED, FAILED = GuestPhase.RUNNING, GuestPhase.SUCCEEDED, GuestPhase.FAILED


@pytest.mark.parametrize(
    ("event", "detail", "cause", "phase"),
    [
        (lv.VIR_DOMAIN_EVENT_DEFINED, 0, None, None),
        (lv.VIR_DOMAIN_EVENT_UNDEFINED, 0, None, None),
        (lv.VIR_DOMAIN_EVENT_STARTED, lv.VIR_DOMAIN_EVENT_STARTED_BOOTED, None, RUNNING),
        (lv.VIR_DOMAIN_EVENT_SUSPENDED, lv.VIR_DOMAIN_EVENT_SUSPENDED_PAUSED, None, RUNNING),
        (lv.VIR_DOMAIN_EVENT_RESUMED, lv.VIR_DOMAIN_EVENT_RESUMED_UNPAUSED, None, RUNNING),
        (lv.VIR_DOMAIN_EVENT_PMSUSPENDED, 0, None, RUNNING),
        (lv.VIR_DOMAIN_EVENT_SHUTDOWN, lv.VIR_DOMAIN_EVENT_SHUTDOWN_FINISHED, None, None),
        (lv.VIR_DOMAIN_EVENT_CRASHED, lv.VIR_DOMAIN_EVENT_CRASHED_PANICKED, None, FAILED),
        (lv.VIR_DOMAIN_EVENT_STOPPED, lv.VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN, None, SUCCEEDED),
        (
            lv.VIR_DOMAIN_EVENT_STOPPED,
            lv.VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN,
            StopCause.GUEST_SHUTDOWN,
            SUCCEEDED,
        ),
        (
            lv.VIR_DOMAIN_EVENT_STOPPED,
            lv.VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN,
            StopCause.REQUESTED,
            SUCCEEDED,
        ),
        (
            lv.VIR_DOMAIN_EVENT_STOPPED,
            lv.VIR_DOMAIN_EVENT_STOPPED_DESTROYED,
            StopCause.REQUESTED,
            SUCCEEDED,
        ),
        (lv.VIR_DOMAIN_EVENT_STOPPED, lv.VIR_DOMAIN_EVENT_STOPPED_DESTROYED, None, FAILED),
        (
            lv.VIR_DOMAIN_EVENT_STOPPED,
            lv.VIR_DOMAIN_EVENT_STOPPED_DESTROYED,
            StopCause.GUEST_CRASH,
            FAILED,
        ),
        (
            lv.VIR_DOMAIN_EVENT_STOPPED,
            lv.VIR_DOMAIN_EVENT_STOPPED_DESTROYED,
            StopCause.RESTART,
            None,
        ),
        (lv.VIR_DOMAIN_EVENT_STOPPED, lv.VIR_DOMAIN_EVENT_STOPPED_CRASHED, None, FAILED),
        (lv.VIR_DOMAIN_EVENT_STOPPED, lv.VIR_DOMAIN_EVENT_STOPPED_FAILED, None, FAILED),
        (lv.VIR_DOMAIN_EVENT_STOPPED, lv.VIR_DOMAIN_EVENT_STOPPED_SAVED, None, SUCCEEDED),
        (lv.VIR_DOMAIN_EVENT_STOPPED, lv.VIR_DOMAIN_EVENT_STOPPED_FROM_SNAPSHOT, None, SUCCEEDED),
        (lv.VIR_DOMAIN_EVENT_STOPPED, lv.VIR_DOMAIN_EVENT_STOPPED_MIGRATED, None, None),
    ],
)
def test_event_phase(
    event: int, detail: int, cause: StopCause | None, phase: GuestPhase | None
) -> None:
    assert Observation("vmi", "uuid", event, detail, cause).phase == phase


@pytest.mark.parametrize(
    ("state", "reason", "phase"),
    [
        (lv.VIR_DOMAIN_RUNNING, lv.VIR_DOMAIN_RUNNING_BOOTED, RUNNING),
        (lv.VIR_DOMAIN_PAUSED, lv.VIR_DOMAIN_PAUSED_USER, RUNNING),
        (lv.VIR_DOMAIN_BLOCKED, 0, RUNNING),
        (lv.VIR_DOMAIN_PMSUSPENDED, 0, RUNNING),
        (lv.VIR_DOMAIN_CRASHED, lv.VIR_DOMAIN_CRASHED_PANICKED, FAILED),
        (lv.VIR_DOMAIN_SHUTDOWN, 0, None),
        (lv.VIR_DOMAIN_SHUTOFF, lv.VIR_DOMAIN_SHUTOFF_SHUTDOWN, SUCCEEDED),
        (lv.VIR_DOMAIN_SHUTOFF, lv.VIR_DOMAIN_SHUTOFF_DESTROYED, FAILED),
        (lv.VIR_DOMAIN_SHUTOFF, lv.VIR_DOMAIN_SHUTOFF_CRASHED, FAILED),
        (lv.VIR_DOMAIN_SHUTOFF, lv.VIR_DOMAIN_SHUTOFF_UNKNOWN, None),
        (lv.VIR_DOMAIN_NOSTATE, 0, None),
    ],
)
def test_state_phase_after_an_agent_restart(
    state: int, reason: int, phase: GuestPhase | None
) -> None:
    assert phase_for(state, reason) == phase


@pytest.mark.parametrize(
    ("event", "paused"),
    [
        (lv.VIR_DOMAIN_EVENT_SUSPENDED, True),
        (lv.VIR_DOMAIN_EVENT_RESUMED, False),
        (lv.VIR_DOMAIN_EVENT_STARTED, False),
        (lv.VIR_DOMAIN_EVENT_PMSUSPENDED, False),
        (lv.VIR_DOMAIN_EVENT_DEFINED, False),
    ],
)
def test_paused_is_reported_apart_from_the_phase(event: int, paused: bool) -> None:
    """A paused guest is still Running (KubeVirt keeps the phase and adds a condition)."""
    assert Observation("vmi", "uuid", event, 0).paused is paused


def test_an_io_error_pause_is_told_apart_from_a_users() -> None:
    """virt-handler's Paused reason: PausedIOError when the hypervisor paused the guest on
    a disk error, from the event, the cause we recorded, or the state found at restart."""
    suspended = lv.VIR_DOMAIN_EVENT_SUSPENDED
    io_error = Observation("vmi", "uuid", suspended, lv.VIR_DOMAIN_EVENT_SUSPENDED_IOERROR)
    assert (io_error.paused, io_error.paused_reason) == (True, "PausedIOError")
    simulated = Observation("vmi", "uuid", suspended, 0, StopCause.IO_ERROR)
    assert simulated.paused_reason == "PausedIOError"
    assert Observation("vmi", "uuid", suspended, 0).paused_reason == ""
    assert Observation("vmi", "uuid", lv.VIR_DOMAIN_EVENT_RESUMED, 0).paused_reason == ""
    assert paused_reason(lv.VIR_DOMAIN_PAUSED, lv.VIR_DOMAIN_PAUSED_IOERROR) == "PausedIOError"
    assert paused_reason(lv.VIR_DOMAIN_PAUSED, lv.VIR_DOMAIN_PAUSED_USER) == ""
    assert paused_reason(lv.VIR_DOMAIN_RUNNING, 0, StopCause.IO_ERROR) == ""


def test_a_state_found_at_restart_is_judged_as_its_event_is() -> None:
    """`judge` gives phase, pause and Paused reason together, for states and events alike."""
    assert judge(lv.VIR_DOMAIN_PAUSED, lv.VIR_DOMAIN_PAUSED_IOERROR) == Verdict(
        GuestPhase.RUNNING, True, "PausedIOError")
    assert judge(lv.VIR_DOMAIN_PAUSED, lv.VIR_DOMAIN_PAUSED_USER) == Verdict(
        GuestPhase.RUNNING, True, "")
    assert judge(lv.VIR_DOMAIN_SHUTOFF, lv.VIR_DOMAIN_SHUTOFF_SHUTDOWN) == Verdict(
        GuestPhase.SUCCEEDED, False, "")
    assert Observation("vmi", "uuid", lv.VIR_DOMAIN_EVENT_UNDEFINED, 0).verdict == Verdict(None)
    io_error = Observation("vmi", "uuid", lv.VIR_DOMAIN_EVENT_SUSPENDED,
                           lv.VIR_DOMAIN_EVENT_SUSPENDED_IOERROR)
    assert io_error.verdict == judge(lv.VIR_DOMAIN_PAUSED, lv.VIR_DOMAIN_PAUSED_IOERROR)

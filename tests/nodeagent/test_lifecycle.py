"""Guest lifecycle against libvirt's test driver, observed through real lifecycle events."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

import libvirt
import pytest

from events.api.errors import Conflict, InvalidSpec, NotFound
from events.language.messages import SimRequest
from nodeagent.agent import NodeAgent, host_for
from nodeagent.config import AgentConfig
from nodeagent.host import SimulationRefused
from nodeagent.lifecycle import (
    StopOutcome,
    define_and_start,
    graceful_stop,
    pause,
    restart,
    unpause,
    verdict_now,
)
from nodeagent.phases import GuestPhase, StopCause
from nodeagent.simhost import (
    SimulatedHost,
    simulate_guest_crash,
    simulate_guest_io_error,
    simulate_guest_shutdown,
)
from nodeagent.watcher import LifecycleWatcher, to_asyncio
from tests.nodeagent.conftest import WAIT_SECONDS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from nodeagent.phases import Observation
    from tests.nodeagent.conftest import Recorder

STARTED = libvirt.VIR_DOMAIN_EVENT_STARTED
STOPPED = libvirt.VIR_DOMAIN_EVENT_STOPPED
SUSPENDED = libvirt.VIR_DOMAIN_EVENT_SUSPENDED
RESUMED = libvirt.VIR_DOMAIN_EVENT_RESUMED


def _gone(conn: libvirt.virConnect, name: str) -> bool:
    return name not in {d.name() for d in conn.listAllDomains()}


def _count(recorder: Recorder, conn: libvirt.virConnect, name: str, event: int) -> int:
    """How often `event` was seen, once a pause proves every earlier event has arrived."""
    pause(conn, name)
    recorder.wait_for(name, SUSPENDED)
    return [o.event for o in recorder.of(name)].count(event)


@pytest.fixture
def guest(
    conn: libvirt.virConnect, watcher: LifecycleWatcher, domain_xml: Callable[..., str]
) -> Iterator[libvirt.virDomain]:
    """A running domain, gone after the test whatever state the test left it in."""
    dom = define_and_start(conn, domain_xml())
    yield dom
    graceful_stop(conn, dom.name(), 0, watcher)


def test_define_and_start_launches_once(
    conn: libvirt.virConnect,
    watcher: LifecycleWatcher,
    recorder: Recorder,
    domain_xml: Callable[..., str],
) -> None:
    xml = domain_xml()
    dom = define_and_start(conn, xml)
    assert define_and_start(conn, xml).ID() == dom.ID()
    assert recorder.wait_for(dom.name(), STARTED).phase is GuestPhase.RUNNING
    assert _count(recorder, conn, dom.name(), STARTED) == 1
    graceful_stop(conn, dom.name(), 0, watcher)


def test_define_and_start_starts_a_defined_inactive_domain(
    conn: libvirt.virConnect, watcher: LifecycleWatcher, domain_xml: Callable[..., str]
) -> None:
    xml = domain_xml()
    conn.defineXML(xml)
    dom = define_and_start(conn, xml)
    assert dom.isActive()
    graceful_stop(conn, dom.name(), 0, watcher)


def test_define_and_start_refuses_a_nameless_domain(conn: libvirt.virConnect) -> None:
    with pytest.raises(InvalidSpec, match=r"domain\.name"):
        define_and_start(conn, "<domain type='test'><memory>1024</memory></domain>")


def test_define_and_start_refuses_same_name_other_uuid(
    conn: libvirt.virConnect, guest: libvirt.virDomain, domain_xml: Callable[..., str]
) -> None:
    with pytest.raises(Conflict, match=guest.name()):
        define_and_start(conn, domain_xml(name=guest.name(), uuid_=str(uuid.uuid4())))


@pytest.mark.parametrize(
    ("grace", "outcome", "detail"),
    [
        (30, StopOutcome.SHUT_DOWN, libvirt.VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN),
        (0, StopOutcome.DESTROYED, libvirt.VIR_DOMAIN_EVENT_STOPPED_DESTROYED),
    ],
)
def test_graceful_stop_succeeds_and_undefines(
    conn: libvirt.virConnect,
    watcher: LifecycleWatcher,
    recorder: Recorder,
    guest: libvirt.virDomain,
    *,
    grace: int,
    outcome: StopOutcome,
    detail: int,
) -> None:
    name = guest.name()
    assert graceful_stop(conn, name, grace, watcher) is outcome
    stopped = recorder.wait_for(name, STOPPED)
    assert (stopped.detail, stopped.cause) == (detail, StopCause.REQUESTED)
    assert stopped.phase is GuestPhase.SUCCEEDED
    assert _gone(conn, name)
    assert graceful_stop(conn, name, grace, watcher) is StopOutcome.ALREADY_GONE


def test_graceful_stop_destroys_a_guest_that_ignores_acpi_after_the_grace_period(
    conn: libvirt.virConnect,
    watcher: LifecycleWatcher,
    recorder: Recorder,
    domain_xml: Callable[..., str],
) -> None:
    name = define_and_start(conn, domain_xml(on_poweroff="restart")).name()
    assert graceful_stop(conn, name, 1, watcher) is StopOutcome.DESTROYED
    stopped = recorder.wait_for(name, STOPPED)
    assert stopped.detail == libvirt.VIR_DOMAIN_EVENT_STOPPED_DESTROYED
    assert stopped.phase is GuestPhase.SUCCEEDED
    assert _gone(conn, name)


def test_graceful_stop_of_a_stopped_domain_undefines_it(
    conn: libvirt.virConnect, watcher: LifecycleWatcher, domain_xml: Callable[..., str]
) -> None:
    name = conn.defineXML(domain_xml()).name()
    assert graceful_stop(conn, name, 30, watcher) is StopOutcome.ALREADY_STOPPED
    assert _gone(conn, name)


def test_destroy_not_on_our_request_fails(recorder: Recorder, guest: libvirt.virDomain) -> None:
    guest.destroy()
    stopped = recorder.wait_for(guest.name(), STOPPED)
    assert stopped.cause is None
    assert stopped.phase is GuestPhase.FAILED


def test_pause_and_unpause_stay_running_and_repeat_safely(
    conn: libvirt.virConnect, recorder: Recorder, guest: libvirt.virDomain
) -> None:
    name = guest.name()
    pause(conn, name)
    pause(conn, name)
    assert guest.state()[0] == libvirt.VIR_DOMAIN_PAUSED
    assert recorder.wait_for(name, SUSPENDED).phase is GuestPhase.RUNNING
    unpause(conn, name)
    unpause(conn, name)
    assert guest.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    assert recorder.wait_for(name, RESUMED).phase is GuestPhase.RUNNING
    assert [o.event for o in recorder.of(name)].count(SUSPENDED) == 1


def test_pause_of_unknown_domain_is_not_found(conn: libvirt.virConnect) -> None:
    with pytest.raises(NotFound, match="no-such-vmi"):
        pause(conn, "no-such-vmi")


def test_soft_restart_reboots_in_place(
    conn: libvirt.virConnect, watcher: LifecycleWatcher, guest: libvirt.virDomain
) -> None:
    restart(conn, guest.name(), watcher)
    assert guest.state()[0] == libvirt.VIR_DOMAIN_RUNNING


def test_hard_restart_power_cycles_without_a_phase_change(
    conn: libvirt.virConnect,
    watcher: LifecycleWatcher,
    recorder: Recorder,
    guest: libvirt.virDomain,
) -> None:
    restart(conn, guest.name(), watcher, hard=True)
    stopped = recorder.wait_for(guest.name(), STOPPED)
    assert stopped.cause is StopCause.RESTART
    assert stopped.phase is None
    assert guest.isActive()
    assert _count(recorder, conn, guest.name(), STARTED) == 2


@pytest.mark.parametrize(
    ("simulate", "cause", "phase"),
    [
        (simulate_guest_shutdown, StopCause.GUEST_SHUTDOWN, GuestPhase.SUCCEEDED),
        (simulate_guest_crash, StopCause.GUEST_CRASH, GuestPhase.FAILED),
    ],
)
def test_simulated_guest_stops(
    conn: libvirt.virConnect,
    watcher: LifecycleWatcher,
    recorder: Recorder,
    guest: libvirt.virDomain,
    *,
    simulate: Callable[[libvirt.virConnect, str, LifecycleWatcher], None],
    cause: StopCause,
    phase: GuestPhase,
) -> None:
    simulate(conn, guest.name(), watcher)
    stopped = recorder.wait_for(guest.name(), STOPPED)
    assert (stopped.cause, stopped.phase) == (cause, phase)


def test_simulated_io_error_pauses_with_its_cause(
    conn: libvirt.virConnect,
    watcher: LifecycleWatcher,
    recorder: Recorder,
    guest: libvirt.virDomain,
) -> None:
    simulate_guest_io_error(conn, guest.name(), watcher)
    paused = recorder.wait_for(guest.name(), SUSPENDED)
    assert (paused.cause, paused.phase, paused.paused_reason) == (
        StopCause.IO_ERROR, GuestPhase.RUNNING, "PausedIOError")
    assert guest.state()[0] == libvirt.VIR_DOMAIN_PAUSED


def agent_config(uri: str) -> AgentConfig:
    return AgentConfig(node="n", nats_url="nats://127.0.0.1:1", libvirt_uri=uri)


@pytest.mark.parametrize("uri", ["qemu:///system", "qemu+ssh://host/system", "xen:///"])
async def test_simulation_is_refused_off_the_test_driver(uri: str) -> None:
    agent = NodeAgent(agent_config(uri))
    with pytest.raises(SimulationRefused, match="test://"):
        await agent.simulate(SimRequest(action="guest-crash", namespace="default", name="vm"))


def test_simulation_is_allowed_on_custom_test_hosts() -> None:
    assert isinstance(host_for(agent_config("test:///tmp/node.xml")), SimulatedHost)


async def test_observations_reach_asyncio(
    conn: libvirt.virConnect, domain_xml: Callable[..., str]
) -> None:
    queue: asyncio.Queue[Observation] = asyncio.Queue()
    with LifecycleWatcher(conn, to_asyncio(asyncio.get_running_loop(), queue)) as watcher:
        name = define_and_start(conn, domain_xml()).name()
        while (observation := await asyncio.wait_for(queue.get(), WAIT_SECONDS)).name != name:
            pass
        assert observation.event in {libvirt.VIR_DOMAIN_EVENT_DEFINED, STARTED}
        graceful_stop(conn, name, 0, watcher)


def test_a_paused_start_leaves_the_vcpus_suspended(
    conn: libvirt.virConnect, watcher: LifecycleWatcher, domain_xml: Callable[..., str]
) -> None:
    """startStrategy: Paused (the test driver cannot start paused: suspended at once)."""
    dom = define_and_start(conn, domain_xml(), paused=True)
    try:
        assert dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED
        unpause(conn, dom.name())
        assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    finally:
        graceful_stop(conn, dom.name(), 0, watcher)


def test_a_started_event_reports_a_guest_started_paused_as_paused(
    conn: libvirt.virConnect, watcher: LifecycleWatcher, recorder: Recorder,
    domain_xml: Callable[..., str],
) -> None:
    """The STARTED event of a paused start says running; by the time it is reported the
    guest is paused, and the report must say so (else the VMI flickers unpaused)."""
    dom = define_and_start(conn, domain_xml(), paused=True)
    started = recorder.wait_for(dom.name(), STARTED)
    assert not started.verdict.paused
    assert verdict_now(conn, started).paused
    graceful_stop(conn, dom.name(), 0, watcher)
    assert verdict_now(conn, started) == started.verdict  # gone: the event's own word

"""Node work through the agent's own queue, on real NATS and the shared `test:///default`
host: work is applied once by event id and a finished VMI is never launched again, past the
node stream's duplicate window and past the agent that did the work; work that is not
work is rejected, and the agent goes on.

A publish past the duplicate window is the same work under a `Nats-Msg-Id` the stream has
not seen, which is what these tests publish: no clock is waited out."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

import libvirt
import msgspec
import pytest
from nats.js.errors import NotFoundError
from structlog.testing import capture_logs

from events.jetstream.streams import WORK_MAX_DELIVER, work_consumer
from events.language.messages import NodeCommand, SimRequest
from nodeagent import lifecycle
from nodeagent.vmiref import VMIRef
from nodeagent.watcher import LifecycleWatcher
from tests.nodeagent.conftest import Recorder
from tests.nodeagent.helpers import WAIT_SECONDS, Cluster, Running, next_report, owned, start
from tests.system.harness import eventually


async def publish(cluster: Cluster, command: NodeCommand, msg_id: str = "") -> int:
    """Put `command` on the node's queue as the dispatcher does (`Nats-Msg-Id` = its event
    id), or under `msg_id`, as a publish past the duplicate window arrives; its sequence."""
    ack = await cluster.nc.jetstream().publish(
        cluster.layout.node_subject(cluster.node, command.verb), msgspec.msgpack.encode(command),
        headers={"Nats-Msg-Id": msg_id or command.event_id})
    assert not ack.duplicate
    return ack.seq


async def worked_through(cluster: Cluster, running: Running, seq: int) -> None:
    """Wait until the agent has acknowledged or terminated every work item up to `seq`
    (the consumer's ack floor), failing at once if the agent ended."""
    js = cluster.nc.jetstream()
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if running.task.done():
            running.task.result()
            raise AssertionError("the agent ended")
        try:
            info = await js.consumer_info(cluster.layout.node_stream, work_consumer(cluster.node))
        except NotFoundError:
            pass  # the consumer is not there yet
        else:
            if info.ack_floor.stream_seq >= seq:
                return
        await asyncio.sleep(0.02)  # poll interval of a condition wait, not synchronisation
    raise AssertionError(f"work up to {seq} not done in {WAIT_SECONDS} s")


def node_command(ref: VMIRef, verb: Literal["stop", "restart", "pause"]) -> NodeCommand:
    return NodeCommand(event_id=str(uuid.uuid4()), verb=verb, namespace=ref.namespace,
                       name=ref.name, uid=ref.uid)


def defines(recorder: Recorder, conn: libvirt.virConnect, make_xml: Callable[..., str],
            domain: str) -> int:
    """How often `domain` was defined on the host, every earlier libvirt event counted: a
    fence domain's own definition comes after them (the driver queues events in order)."""
    fence = conn.defineXML(make_xml())
    recorder.wait_for(fence.name(), libvirt.VIR_DOMAIN_EVENT_DEFINED)
    fence.undefine()
    return sum(o.event == libvirt.VIR_DOMAIN_EVENT_DEFINED for o in recorder.of(domain))


@pytest.mark.parametrize("again", ["same event", "new event"])
@pytest.mark.parametrize("finish", ["stop", "guest-shutdown"])
@pytest.mark.usefixtures("watcher")
async def test_a_finished_vmi_is_not_launched_again(
        cluster: Cluster, nats_url: str, finish: str, again: str, *,
        conn: libvirt.virConnect, recorder: Recorder, domain_xml: Callable[..., str]) -> None:
    """Launched, then stopped (deleted) or shut down by its guest; then the launch comes
    again past the duplicate window, to an agent that did not do the work (the record
    outlives its maker), as the same event (a dispatcher replaying from an old checkpoint)
    or another: no second domain is defined, no guest revived."""
    ref = await cluster.placed("once")
    launch = cluster.launch(ref)
    reports = await cluster.nc.jetstream().pull_subscribe(
        cluster.layout.reports_filter, stream=cluster.layout.reports_stream)
    first = await start(cluster, nats_url)
    try:
        await worked_through(cluster, first, await publish(cluster, launch))
        assert owned(first.agent, cluster.namespace) == [ref.uid]
        if finish == "stop":
            await worked_through(cluster, first, await publish(cluster, node_command(ref, "stop")))
        else:
            await first.agent.simulate(SimRequest(action="guest-shutdown",
                                                  namespace=ref.namespace, name=ref.name))
            await next_report(reports, lambda r: bool(r.domain and r.domain.uid == ref.uid
                                                      and r.domain.gone))
        assert owned(first.agent, cluster.namespace) == []
    finally:
        await first.close()

    second = await start(cluster, nats_url)
    try:
        redo = launch if again == "same event" else msgspec.structs.replace(
            launch, event_id=str(uuid.uuid4()))
        await worked_through(cluster, second,
                             await publish(cluster, redo, msg_id=str(uuid.uuid4())))
        assert owned(second.agent, cluster.namespace) == [], "no guest revived"
        assert defines(recorder, conn, domain_xml, ref.domain) == 1, "defined once"
    finally:
        await second.close()


async def test_a_stop_of_a_gone_instance_leaves_its_successor_running(
        cluster: Cluster, nats_url: str) -> None:
    """A stop for a VMI failed while its node was lost comes after its successor (same name,
    another uid) was launched here: the successor's domain is not the stopped one's."""
    heir = await cluster.placed("heir")
    gone = VMIRef(heir.namespace, heir.name, str(uuid.uuid4()))
    running = await start(cluster, nats_url)
    try:
        await worked_through(cluster, running, await publish(cluster, cluster.launch(heir)))
        await worked_through(cluster, running,
                             await publish(cluster, node_command(gone, "stop")))
        assert owned(running.agent, cluster.namespace) == [heir.uid]
        await worked_through(cluster, running,
                             await publish(cluster, node_command(heir, "stop")))
        assert owned(running.agent, cluster.namespace) == []
    finally:
        await running.close()


def boot_reason(conn: libvirt.virConnect, ref: VMIRef) -> int:
    state, reason = conn.lookupByName(ref.domain).state()
    assert state == libvirt.VIR_DOMAIN_RUNNING
    return int(reason)


def mark_unpaused(conn: libvirt.virConnect, ref: VMIRef) -> None:
    """A running guest's state reason becomes "unpaused", until a reboot makes it "booted":
    the test driver's reboot leaves no other trace."""
    dom = conn.lookupByName(ref.domain)
    dom.suspend()
    dom.resume()
    assert boot_reason(conn, ref) == libvirt.VIR_DOMAIN_RUNNING_UNPAUSED


async def test_a_repeated_soft_reboot_reboots_once(
        cluster: Cluster, nats_url: str, conn: libvirt.virConnect,
        watcher: LifecycleWatcher) -> None:
    """A soft reboot (`restart`) delivered again past the duplicate window, same event id:
    the guest reboots for the first delivery only."""
    ref = await cluster.placed("rebooted")
    running = await start(cluster, nats_url)
    try:
        await worked_through(cluster, running, await publish(cluster, cluster.launch(ref)))
        restart = node_command(ref, "restart")
        mark_unpaused(conn, ref)
        await worked_through(cluster, running, await publish(cluster, restart))
        assert boot_reason(conn, ref) == libvirt.VIR_DOMAIN_RUNNING_BOOTED, "rebooted"

        mark_unpaused(conn, ref)
        await worked_through(cluster, running,
                             await publish(cluster, restart, msg_id=str(uuid.uuid4())))
        assert boot_reason(conn, ref) == libvirt.VIR_DOMAIN_RUNNING_UNPAUSED, "not again"
    finally:
        lifecycle.graceful_stop(conn, ref.domain, 0, watcher)  # the host outlives the agent
        await running.close()


async def test_work_on_a_running_guest_is_done_only_to_the_instance_it_names(
        cluster: Cluster, nats_url: str, conn: libvirt.virConnect,
        watcher: LifecycleWatcher) -> None:
    """A pause, or a restart, for another instance (uid) of the VMI, as a replayed item
    or one outliving its instance brings: the running guest is neither paused nor
    rebooted; for its own uid it is."""
    ref = await cluster.placed("named")
    stranger = VMIRef(ref.namespace, ref.name, str(uuid.uuid4()))
    running = await start(cluster, nats_url)
    try:
        await worked_through(cluster, running, await publish(cluster, cluster.launch(ref)))
        mark_unpaused(conn, ref)
        for verb in ("restart", "pause"):
            await worked_through(cluster, running,
                                 await publish(cluster, node_command(stranger, verb)))
        assert conn.lookupByName(ref.domain).state()[0] == libvirt.VIR_DOMAIN_RUNNING
        assert boot_reason(conn, ref) == libvirt.VIR_DOMAIN_RUNNING_UNPAUSED, "not rebooted"
        await worked_through(cluster, running, await publish(cluster, node_command(ref, "pause")))
        assert conn.lookupByName(ref.domain).state()[0] == libvirt.VIR_DOMAIN_PAUSED
    finally:
        lifecycle.graceful_stop(conn, ref.domain, 0, watcher)  # the host outlives the agent
        await running.close()


async def test_a_stop_libvirt_failed_is_done_again(
        cluster: Cluster, nats_url: str, conn: libvirt.virConnect,
        watcher: LifecycleWatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """libvirt fails a stop once (libvirtd restarting, say): the stop is not recorded as
    done, it comes again, and the guest is stopped and reported gone. It was recorded and
    acknowledged with the guest still running, for good."""
    ref = await cluster.placed("stubborn")
    running = await start(cluster, nats_url)
    real_stop = lifecycle.graceful_stop
    failures: list[str] = []

    def failing_once(*args: object) -> lifecycle.StopOutcome:
        if not failures:
            failures.append("planted")
            raise libvirt.libvirtError("libvirtd is restarting (planted)")
        return real_stop(*args)  # type: ignore[arg-type]

    try:
        await worked_through(cluster, running, await publish(cluster, cluster.launch(ref)))
        monkeypatch.setattr(lifecycle, "graceful_stop", failing_once)
        await worked_through(cluster, running, await publish(cluster, node_command(ref, "stop")))
        assert failures == ["planted"]
        with pytest.raises(libvirt.libvirtError):
            conn.lookupByName(ref.domain)
    finally:
        real_stop(conn, ref.domain, 0, watcher)  # the host outlives the agent
        await running.close()


async def test_an_observation_libvirt_fails_leaves_the_agent_reporting(
        cluster: Cluster, nats_url: str, conn: libvirt.virConnect,
        watcher: LifecycleWatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """libvirt fails once while the agent reads a guest's state after a lifecycle event:
    one line, and the agent goes on to report the next (the error ended the agent)."""
    ref = await cluster.placed("observed")
    running = await start(cluster, nats_url)
    real_verdict = lifecycle.verdict_now
    failures: list[str] = []

    def failing_once(*args: Any) -> Any:
        if not failures:
            failures.append("planted")
            raise libvirt.libvirtError("libvirtd is restarting (planted)")
        return real_verdict(*args)

    try:
        await worked_through(cluster, running, await publish(cluster, cluster.launch(ref)))
        monkeypatch.setattr(lifecycle, "verdict_now", failing_once)
        dom = conn.lookupByName(ref.domain)
        dom.suspend()  # its event's verdict fails

        async def failed() -> bool:
            return bool(failures)
        await eventually(failed, what="the planted failure")
        dom.resume()
        dom.suspend()  # reported

        async def paused_reported() -> bool:
            assert not running.task.done(), "the agent ended"
            return running.agent.reporter.reported.get(ref.uid, (None, False, ""))[1]
        await eventually(paused_reported, what="the pause reported")
    finally:
        lifecycle.graceful_stop(conn, ref.domain, 0, watcher)  # the host outlives the agent
        await running.close()


async def test_bad_work_is_rejected_and_the_agent_goes_on(
        cluster: Cluster, nats_url: str, conn: libvirt.virConnect,
        watcher: LifecycleWatcher) -> None:
    """Bytes that are no node command, and node commands that make no sense, each logged
    with its subject, counted and terminated (never delivered again); the launch behind them
    runs."""
    ref = await cluster.placed("after-bad")
    good = cluster.launch(ref)
    launch_subject = cluster.layout.node_subject(cluster.node, "launch")
    stop_subject = cluster.layout.node_subject(cluster.node, "stop")
    bad = [
        (launch_subject, b"\xc1 not msgpack"),
        (launch_subject, msgspec.msgpack.encode({**msgspec.to_builtins(good),
                                                 "verb": "explode"})),
        (stop_subject, msgspec.msgpack.encode(good)),
        (launch_subject, msgspec.msgpack.encode(msgspec.structs.replace(good, event_id=""))),
        (launch_subject, msgspec.msgpack.encode(msgspec.structs.replace(
            good, event_id=str(uuid.uuid4()), uid=str(uuid.uuid4())))),
        # An id past what a subject may hold closed the agent's connection for good.
        (launch_subject, msgspec.msgpack.encode(msgspec.structs.replace(
            good, event_id="e" * 5000))),
    ]
    js = cluster.nc.jetstream()
    with capture_logs() as logs:
        running = await start(cluster, nats_url)
        try:
            for subject, data in bad:
                await js.publish(subject, data)
            await worked_through(cluster, running, await publish(cluster, good))
            assert owned(running.agent, cluster.namespace) == [ref.uid]
        finally:
            lifecycle.graceful_stop(conn, ref.domain, 0, watcher)  # the host outlives the agent
            await running.close()
    rejected = [e for e in logs if e["event"] == "node work rejected"]
    assert [e["subject"] for e in rejected] == [subject for subject, _ in bad]
    assert running.agent.work.rejected == len(bad)
    info = await js.consumer_info(cluster.layout.node_stream, work_consumer(cluster.node))
    assert info.num_redelivered == 0, "terminated, not left to come again"
    assert info.config.max_deliver == WORK_MAX_DELIVER

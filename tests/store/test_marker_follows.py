"""A command whose one event is stored alone, before its marker (the writer's plain-publish
path), and a writer stopped between the two: the command still gets exactly one outcome,
accepted with that event's sequence, and no second event, however it is delivered again.

The crash's state is made by the writer's own code up to its first publish (the decision,
the event marked `marker_follows`, published on a real nats-server) and nothing after it:
what a `kill -9` between the two publishes leaves in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import structlog
from nats.js.errors import KeyNotFoundError

from controlplane.handling import Result
from controlplane.service import serve
from controlplane.user.client import Client
from controlplane.writer import Writer
from events.datastore import OutcomeUnknown
from events.directget import read_all
from events.messages import Command, Outcome, marker_aggregate, outcome_key
from events.streams import ensure_all
from events.subjects import Layout
from projections.follower import first_outcome, read_event
from tests.system.harness import vm_manifest

WINDOW = 0.1
"""The commands stream's duplicate window here: the server's minimum."""
VM = "vm.default.web"


@contextlib.asynccontextmanager
async def control_plane(nats_url: str, layout: Layout) -> AsyncIterator[None]:
    """A fresh control plane (intake, control loop, writer) in this process, until left."""
    stop = asyncio.Event()
    served = asyncio.ensure_future(serve(nats_url, layout, stop=stop))
    try:
        yield
    finally:
        stop.set()
        await served


async def crash_after_the_event(vb: Client, command: Command) -> int:
    """What a writer stopped between its two publishes leaves: the command's one event,
    stored alone and marked `marker_follows`, and no marker. Its stream sequence."""
    writer = Writer(vb.nc, vb.layout)
    writer.handler.memory.complete = True  # the log holds nothing yet: complete
    decision, verdict = await writer.handler._decide(command, {}, structlog.get_logger())
    alone = writer.handler._alone(decision, verdict)
    assert alone is not None, "a create of one VM is stored alone"
    [seq] = await writer.handler.log.publish([alone])
    return seq


async def stored(vb: Client, agg_id: str) -> list[tuple[int, str]]:
    """(version, causation) of each event stored on `agg_id`."""
    msgs = await read_all(vb.nc, vb.layout.events_stream, vb.layout.aggregate_subject(agg_id))
    return [(e.originator_version, e.causation_id) for m in msgs
            if (e := read_event(m)) is not None]


async def marker(vb: Client, command_id: str) -> tuple[Outcome, int] | None:
    return first_outcome(await read_all(
        vb.nc, vb.layout.events_stream,
        vb.layout.aggregate_subject(marker_aggregate(command_id))))


async def answered(vb: Client, command: Command) -> Outcome:
    """The outcome the intake puts in the bucket for this delivery (waited for)."""
    outcomes = await vb.js.key_value(vb.layout.outcomes_bucket)
    for _ in range(400):
        with contextlib.suppress(KeyNotFoundError):
            entry = await outcomes.get(outcome_key(command.actor, command.id))
            if entry.value:
                return msgspec.msgpack.decode(entry.value, type=Outcome)
        await asyncio.sleep(0.05)  # poll interval of a condition wait, not synchronisation
    raise AssertionError(f"no outcome for {command.id}")


async def forget_answer(vb: Client, command: Command) -> None:
    outcomes = await vb.js.key_value(vb.layout.outcomes_bucket)
    await outcomes.purge(outcome_key(command.actor, command.id))


async def publish(vb: Client, command: Command) -> None:
    """The command onto the commands stream, under its own id as message id (as a client
    sends it): a copy sent again within the duplicate window is dropped by the stream."""
    subject = vb.layout.command_subject(command.actor, "virtualmachine", command.verb)
    ack = await vb.js.publish(subject, msgspec.msgpack.encode(command),
                              headers={"Nats-Msg-Id": command.id})
    assert not ack.duplicate, "past the window: the stream takes it again"


@pytest.fixture
async def vb(nats_url: str, prefix: str) -> AsyncIterator[Client]:
    client = await Client.connect(nats_url, prefix, actor="user:dana")
    await ensure_all(client.js, client.layout)
    try:
        yield client
    finally:
        await client.close()


async def shrink_the_window(vb: Client) -> None:
    info = await vb.js.stream_info(vb.layout.commands_stream)
    info.config.duplicate_window = WINDOW
    await vb.js.update_stream(info.config)


@pytest.mark.parametrize("plane_running", [False, True],
                         ids=["fresh-control-plane", "live-control-plane"])
async def test_a_command_stopped_between_its_event_and_its_marker_is_settled_by_the_event(
        vb: Client, nats_url: str, plane_running: bool) -> None:
    """The event is stored and its marker is not: delivered again (to a fresh control plane
    that folds the log first, or to one that watched the event arrive), and again past the
    commands stream's duplicate window, the command is accepted with that event's sequence;
    the VM is created once."""
    command = vb.command("VirtualMachine", "apply", manifest=vm_manifest("web", "Halted"))
    command = msgspec.structs.replace(command, id=str(uuid.uuid4()))
    if plane_running:
        plane = control_plane(nats_url, vb.layout)
        await plane.__aenter__()
        await shrink_the_window(vb)
        seq = await crash_after_the_event(vb, command)
    else:
        seq = await crash_after_the_event(vb, command)
        plane = control_plane(nats_url, vb.layout)
        await plane.__aenter__()
        await shrink_the_window(vb)
    try:
        await publish(vb, command)
        first = await answered(vb, command)
        assert first == Outcome(command_id=command.id, accepted=True, sequences=[seq])
        await forget_answer(vb, command)
        await asyncio.sleep(WINDOW * 3)  # past the commands stream's duplicate window
        await publish(vb, command)
        assert await answered(vb, command) == first
    finally:
        await plane.__aexit__(None, None, None)
    assert await stored(vb, VM) == [(1, command.id)]
    found = await marker(vb, command.id)
    assert found is not None and found[0] == first and found[1] > seq


async def test_a_writer_that_has_not_folded_the_event_finds_it_after_its_conflict(
        vb: Client) -> None:
    """A writer whose memory is complete but behind the log (the event not folded yet)
    decides the create again; the server refuses it (the VM's subject moved), and the
    writer, finding no marker, reads the VM again: the event there, marked
    `marker_follows`, names this command, so it is the command's outcome."""
    command = vb.command("VirtualMachine", "apply", manifest=vm_manifest("web", "Halted"))
    seq = await crash_after_the_event(vb, command)
    behind = Writer(vb.nc, vb.layout)
    behind.handler.memory.complete = True  # complete as of before the event
    result = await behind.execute(command)
    assert result.outcome == Outcome(command_id=command.id, accepted=True, sequences=[seq])
    assert await stored(vb, VM) == [(1, command.id)]
    assert (await behind.execute(command)).outcome == result.outcome


async def test_a_lone_events_outcome_is_announced_once_before_execute_returns(
        vb: Client) -> None:
    """Stored alone, a command's outcome is announced once (while its marker is appended),
    and `execute` returns only once the announcement is done."""
    command = vb.command("VirtualMachine", "apply", manifest=vm_manifest("web", "Halted"))
    writer = Writer(vb.nc, vb.layout)
    writer.handler.memory.complete = True  # the log holds nothing yet: complete
    told: list[Outcome] = []
    done = asyncio.Event()

    async def announce(outcome: Outcome) -> None:  # done only once the marker is stored
        told.append(outcome)
        for _ in range(400):  # each a Direct Get: a condition wait, not a sleep
            if await marker(vb, command.id) is not None:
                done.set()
                return
        raise AssertionError("the command's marker was never stored")

    result = await writer.handler.execute(command, announce)
    assert result.outcome.accepted and told == [result.outcome]
    assert done.is_set(), "execute returned before the announcement was done"
    [event] = await read_all(vb.nc, vb.layout.events_stream, vb.layout.aggregate_subject(VM))
    assert (stored_event := read_event(event)) is not None and stored_event.marker_follows, \
        "the lone-event path"


async def test_a_marker_with_no_answer_outranks_an_announcement_that_failed(
        vb: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """The marker's append gets no answer (and nothing is stored) while the announcement is
    still under way, and then fails: the marker's `OutcomeUnknown` is what comes out (a later
    delivery settles it), only once the announcement has run its course, and the
    announcement's own error is retrieved, not left for the event loop to report."""
    command = vb.command("VirtualMachine", "apply", manifest=vm_manifest("web", "Halted"))
    writer = Writer(vb.nc, vb.layout)
    handler = writer.handler
    handler.memory.complete = True
    unretrieved: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: unretrieved.append(ctx))
    marker_failed, finished = asyncio.Event(), asyncio.Event()
    finished_when_raised: list[bool] = []

    async def no_answer(_messages: object) -> list[int]:
        raise OutcomeUnknown("no answer to an append (planted)")

    publish_marker, publish_alone = handler._publish_marker, handler._publish_alone

    async def failing_marker(*args: Any) -> object:
        try:
            return await publish_marker(*args)
        except OutcomeUnknown:
            marker_failed.set()
            raise

    async def observed_alone(*args: Any) -> Result:
        try:
            return await publish_alone(*args)
        except OutcomeUnknown:
            finished_when_raised.append(finished.is_set())
            raise

    async def announce(_outcome: Outcome) -> None:
        await marker_failed.wait()
        for _ in range(5):
            await asyncio.sleep(0)
        finished.set()
        raise RuntimeError("the outcomes bucket refused the put (planted)")

    monkeypatch.setattr(handler.commits, "publish", no_answer)
    monkeypatch.setattr(handler, "_publish_marker", failing_marker)
    monkeypatch.setattr(handler, "_publish_alone", observed_alone)
    with pytest.raises(OutcomeUnknown):
        await handler.execute(command, announce)
    assert finished_when_raised == [True], "the marker's error left before the announcement"
    gc.collect()  # a task whose error nobody retrieved reports it when collected
    assert unretrieved == []
    assert await marker(vb, command.id) is None

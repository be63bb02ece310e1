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
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import pytest
import structlog
from nats.js.errors import KeyNotFoundError

from controlplane.service import serve
from controlplane.user.client import Client
from controlplane.writer import Writer
from events.jetstream.datastore import OutcomeUnknown
from events.jetstream.directget import read_all, sequence
from events.jetstream.streams import ensure_all
from events.language.messages import Command, Outcome, marker_aggregate, outcome_key
from events.language.subjects import Layout
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


async def test_a_lone_events_outcome_is_announced_once_its_event_is_stored(
        vb: Client) -> None:
    """Stored alone, a command's outcome is announced once, when its event is stored (the
    outcome is final then), and its marker is stored by the time `execute` returns."""
    command = vb.command("VirtualMachine", "apply", manifest=vm_manifest("web", "Halted"))
    writer = Writer(vb.nc, vb.layout)
    writer.handler.memory.complete = True  # the log holds nothing yet: complete
    told: list[tuple[Outcome, list[tuple[int, str]]]] = []

    async def announce(outcome: Outcome) -> None:  # what the log held when told
        told.append((outcome, await stored(vb, VM)))

    result = await writer.handler.execute(command, announce)
    assert result.outcome.accepted
    assert told == [(result.outcome, [(1, command.id)])], "told once, the event stored"
    found = await marker(vb, command.id)
    assert found is not None and found[0] == result.outcome
    [event] = await read_all(vb.nc, vb.layout.events_stream, vb.layout.aggregate_subject(VM))
    assert (stored_event := read_event(event)) is not None and stored_event.marker_follows, \
        "the lone-event path"


@pytest.mark.parametrize("failing", ["marker", "announcement"])
async def test_a_command_whose_marker_failed_is_settled_by_its_event_when_worked_again(
        vb: Client, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    """After the event is stored alone, the marker's append gets no answer (nothing
    stored), or the announcement fails before it: `execute` raises, and the same writer
    working the command again at once (the intake retries in place), before any control
    loop has folded the event, appends the marker, accepted with the event's sequence. Its
    memory holds the VM already: decided again there, the `apply` would be a no-op, a
    second outcome."""
    command = vb.command("VirtualMachine", "apply", manifest=vm_manifest("web", "Halted"))
    handler = Writer(vb.nc, vb.layout).handler
    handler.memory.complete = True
    told: list[Outcome] = []

    async def announce(outcome: Outcome) -> None:
        told.append(outcome)
        if failing == "announcement" and len(told) == 1:
            raise RuntimeError("the connection closed under the announcement (planted)")

    async def no_answer(_messages: object) -> list[int]:
        raise OutcomeUnknown("no answer to an append (planted)")

    with monkeypatch.context() as planted:
        if failing == "marker":
            planted.setattr(handler.commits, "publish", no_answer)
        with pytest.raises(OutcomeUnknown if failing == "marker" else RuntimeError):
            await handler.execute(command, announce)
    assert await marker(vb, command.id) is None
    result = await handler.execute(command, announce)
    [event] = await read_all(vb.nc, vb.layout.events_stream, vb.layout.aggregate_subject(VM))
    first = Outcome(command_id=command.id, accepted=True, sequences=[sequence(event)])
    assert result.outcome == first
    assert told == [first, first]
    found = await marker(vb, command.id)
    assert found is not None and found[0] == first
    assert await stored(vb, VM) == [(1, command.id)]


async def test_two_commands_with_one_id_for_two_objects_are_decided_once(vb: Client) -> None:
    """One id reused for another object (a client's bug, or a hostile one), both in flight
    at once: each would find no marker and store its event alone, one of them then with no
    outcome that names it. Decided one after the other, the second is answered with the
    first's outcome: one event, one marker, the same outcome told to both."""
    writer = Writer(vb.nc, vb.layout)
    writer.handler.memory.complete = True  # the log holds nothing yet: complete
    commands = [msgspec.structs.replace(
        vb.command("VirtualMachine", "apply", manifest=vm_manifest(name, "Halted")),
        id="one-id") for name in ("web", "db")]
    told: dict[str, list[Outcome]] = {"web": [], "db": []}

    def teller(name: str) -> Callable[[Outcome], Awaitable[None]]:
        async def announce(outcome: Outcome) -> None:
            told[name].append(outcome)
        return announce

    results = await asyncio.gather(*(writer.execute(command, teller(name))
                                     for command, name in zip(commands, told, strict=True)))
    first = results[0].outcome
    assert first.accepted and results[1].outcome == first
    assert told == {"web": [first], "db": [first]}
    assert await stored(vb, VM) == [(1, "one-id")]
    assert await stored(vb, "vm.default.db") == [], "the second object untouched"
    found = await marker(vb, "one-id")
    assert found is not None and found[0] == first


async def test_a_lone_event_folded_after_its_marker_is_not_taken_for_one_without(
        vb: Client) -> None:
    """The control plane's live follow brings no markers back (`FOLLOWED_KINDS`), so the
    writer knows its own as it stores them. Its lone event folded after its marker was
    stored (the follow behind, as under load) or before (the follow ahead) leaves nothing
    waiting for a marker; otherwise every such command would stay in `unmarked` for good,
    and one delivered again would take the settling path instead of its look-up."""
    writer = Writer(vb.nc, vb.layout)
    memory = writer.handler.memory
    memory.complete = True  # the log holds nothing yet: complete

    async def fold(agg_id: str) -> None:  # as the control loop's follow hands it over
        for msg in await read_all(vb.nc, vb.layout.events_stream,
                                  vb.layout.aggregate_subject(agg_id)):
            event = read_event(msg)
            assert event is not None and event.marker_follows, "the lone-event path"
            memory.observe(event, sequence(msg))

    async def fold_early(_outcome: Outcome) -> None:  # the event stored, its marker not yet
        await fold("vm.default.ahead")

    behind = vb.command("VirtualMachine", "apply", manifest=vm_manifest("behind", "Halted"))
    ahead = vb.command("VirtualMachine", "apply", manifest=vm_manifest("ahead", "Halted"))
    assert (await writer.execute(behind)).outcome.accepted
    await fold("vm.default.behind")
    assert (await writer.execute(ahead, fold_early)).outcome.accepted
    assert memory.unmarked == {}
    for command in (behind, ahead):
        found = await marker(vb, command.id)
        assert found is not None and found[0].accepted

"""The command intake on a real nats-server: a command delivered again past the command
stream's duplicate window answers its first outcome; what cannot be decoded is
dead-lettered and the intake goes on; a command claiming another actor is refused for good;
the intake holds no more than `INTAKE_CONCURRENCY` messages at once, the rest wait in the
stream."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from functools import partial

import msgspec
import pytest
from nats.js.errors import KeyNotFoundError, NotFoundError

from controlplane.defaults import INTAKE_CONCURRENCY
from controlplane.intake import COMMANDS_CONSUMER, CommandIntake, Consumer
from controlplane.user.actions import dead_letters
from controlplane.user.client import Client
from controlplane.writer import Writer
from events.jetstream.connect import connect
from events.jetstream.datastore import TOPIC_HEADER, VERSION_HEADER
from events.jetstream.directget import read_all, sequence
from events.jetstream.streams import ensure_all
from events.language.codec import encode
from events.language.messages import (
    Command,
    Outcome,
    marker_aggregate,
    outcome_key,
    recorded_outcome,
)
from events.language.subjects import Layout
from projections.follower import MISPLACED, NO_TOPIC, NOT_A_MARKER, read_event
from tests.system.harness import topics_since, vm_manifest


@pytest.fixture
async def vb(nats_url: str, prefix: str) -> AsyncIterator[Client]:
    """A client of an installation whose control plane runs only its command intake."""
    client = await Client.connect(nats_url, prefix, actor="user:dana")
    await ensure_all(client.js, client.layout)
    stop = asyncio.Event()
    intake = asyncio.ensure_future(
        CommandIntake(client.nc, client.layout, Writer(client.nc, client.layout)).run(stop))
    try:
        yield client
    finally:
        stop.set()
        await intake
        await client.close()


async def publish_again(vb: Client, command: Command) -> None:
    """The command once more, under a message id the stream has not seen: what a client's
    retry after the duplicate window looks like to the stream."""
    subject = vb.layout.command_subject(command.actor, "virtualmachine", command.verb)
    await vb.js.publish(subject, msgspec.msgpack.encode(command),
                        headers={"Nats-Msg-Id": f"{command.id}-again"})


async def test_a_command_delivered_again_past_the_window_answers_its_first_outcome(
        vb: Client) -> None:
    start = vb.command("VirtualMachine", "start", "default", "web")
    refused = await vb.run(start, check=False)
    assert not refused.accepted and refused.field == "metadata.name"
    [created] = await vb.apply(vm_manifest("web", "Halted"))
    before = created.sequences[-1]
    await publish_again(vb, start)
    head = (await vb.js.stream_info(vb.layout.commands_stream)).state.last_seq
    await _eventually_consumed(vb, head)
    assert await vb.outcome(start.id) == refused
    assert await topics_since(vb, before) == []


async def test_what_cannot_be_decoded_is_dead_lettered_and_the_intake_goes_on(
        vb: Client) -> None:
    subject = vb.layout.command_subject("user:dana", "virtualmachine", "apply")
    await vb.js.publish(subject, b"\xc1 not msgpack")
    await vb.js.publish(subject, msgspec.msgpack.encode({"id": "", "actor": "user:dana",
                                                         "kind": "x", "verb": "y"}))
    [outcome] = await vb.apply(vm_manifest("after"))
    assert outcome.accepted
    dead = await read_all(vb.nc, vb.layout.dead_letter_stream,
                          vb.layout.dead_letter_subject(vb.layout.commands_stream))
    reasons = [(m.headers or {})["Vb-Reason"] for m in dead]
    assert len(reasons) == 2
    assert reasons[0].startswith("not a command")
    assert reasons[1] == "id: must be 1 to 200 characters"
    # ... and an operator lists them (`virtbus dead-letters`)
    assert [(d["stream"], d["reason"]) for d in await dead_letters(vb)] == [
        (vb.layout.commands_stream, r) for r in reasons]


async def test_a_command_carrying_a_pulls_status_headers_is_worked_like_any_other(
        vb: Client) -> None:
    """A delivery keeps the headers its publisher set. A command carrying what the server's
    word that a pull ended carries (`Status`, a pending count) is decided like any other,
    and the intake goes on taking commands: it was never worked, and it left the intake
    counting a million messages asked for, none coming."""
    subject = vb.layout.command_subject(vb.actor, "virtualmachine", "apply")
    statuses = [{"Status": "408", "Nats-Pending-Messages": "-1000000"},
                {"Status": "100", "Nats-Pending-Messages": "x"}, {"Status": "409"}]
    for i, status in enumerate(statuses):
        command = vb.command("VirtualMachine", "apply", manifest=vm_manifest(f"vm-{i}"))
        await vb.js.publish(subject, msgspec.msgpack.encode(command),
                            headers={"Nats-Msg-Id": command.id, **status})
        assert (await vb.outcome(command.id, timeout=30)).accepted
    [later] = await vb.apply(vm_manifest("later"))
    assert later.accepted


async def test_a_dead_letter_is_stored_before_its_message_is_given_up(vb: Client) -> None:
    """The dead-letter stream cannot take a message now (it is not there): the message is
    not terminated, it is kept claimed and dead-lettered again until the stream is back."""
    await vb.js.delete_stream(vb.layout.dead_letter_stream)
    subject = vb.layout.command_subject("user:dana", "virtualmachine", "apply")
    await vb.js.publish(subject, b"\xc1 not msgpack")
    await eventually_consumed_and_waiting(vb)
    await ensure_all(vb.js, vb.layout)  # the dead-letter stream back
    for _ in range(400):
        with contextlib.suppress(NotFoundError):
            dead = await read_all(vb.nc, vb.layout.dead_letter_stream,
                                  vb.layout.dead_letter_subject(vb.layout.commands_stream))
            if dead:
                assert (dead[0].headers or {})["Vb-Reason"].startswith("not a command")
                return
        await asyncio.sleep(0.05)  # poll interval of a condition wait, not synchronisation
    raise AssertionError("the message was never dead-lettered")


async def eventually_consumed_and_waiting(vb: Client) -> None:
    """Until the intake holds the one message, unacknowledged (being dead-lettered)."""
    for _ in range(400):
        with contextlib.suppress(NotFoundError):  # the intake has not made its consumer yet
            info = await vb.js.consumer_info(vb.layout.commands_stream, COMMANDS_CONSUMER)
            if info.delivered.stream_seq >= 1 and info.num_ack_pending >= 1:
                return
        await asyncio.sleep(0.05)  # poll interval of a condition wait, not synchronisation
    raise AssertionError("the intake never took the message")


async def test_a_command_claiming_another_actor_is_refused_for_good(
        vb: Client, nats_url: str) -> None:
    [created] = await vb.apply(vm_manifest("web", "Halted"))
    forged = Command(id=str(uuid.uuid4()), actor="user:alice", kind="VirtualMachine",
                     verb="start", namespace="default", name="web")
    subject = vb.layout.command_subject("user:mallory", "virtualmachine", "start")
    await vb.js.publish(subject, msgspec.msgpack.encode(forged),
                        headers={"Nats-Msg-Id": forged.id})
    refused = await vb.outcome(forged.id)
    assert (refused.accepted, refused.field) == (False, "actor")
    # Announced to its sender, mallory, not into alice's outcomes.
    kv = await vb.js.key_value(vb.layout.outcomes_bucket)
    for _ in range(400):
        with contextlib.suppress(KeyNotFoundError):
            if (await kv.get(outcome_key("user:mallory", forged.id))).value:
                break
        await asyncio.sleep(0.05)  # poll interval of a condition wait, not synchronisation
    else:
        raise AssertionError("the refusal was not announced to its sender")
    with pytest.raises(KeyNotFoundError):
        await kv.get(outcome_key("user:alice", forged.id))
    # Sent again on alice's own subject, the same id is answered, not decided.
    alice = await Client.connect(nats_url, vb.layout.prefix, actor="user:alice")
    try:
        assert await alice.run(forged, check=False) == refused
    finally:
        await alice.close()
    assert await topics_since(vb, created.sequences[-1]) == ["CommandRejected.v1"]


async def _eventually_consumed(vb: Client, last: int) -> None:
    """Until the intake has acknowledged every command up to stream sequence `last`."""
    consumer = "controlplane-commands"
    for _ in range(200):
        info = await vb.js.consumer_info(vb.layout.commands_stream, consumer)
        if info.ack_floor.stream_seq >= last:
            return
        await asyncio.sleep(0.05)  # poll interval of a condition wait, not synchronisation
    raise AssertionError(f"the intake did not acknowledge up to {last}")


async def test_an_outcome_gone_from_the_bucket_is_read_from_the_log(vb: Client) -> None:
    """The bucket only delivers (its entries expire after a week); the marker is the record."""
    [created] = await vb.apply(vm_manifest("web", "Halted"))
    [command_id] = await _command_ids(vb)
    kv = await vb.js.key_value(vb.layout.outcomes_bucket)
    await kv.purge(outcome_key(vb.actor, command_id))
    assert await vb.outcome(command_id, timeout=5) == created


async def test_an_outcome_the_bucket_cannot_store_still_reaches_its_client(vb: Client) -> None:
    """The bucket only delivers: with its stream refusing every write (sealed here; a stream
    whose leader is being elected refuses alike), a command is still decided, its client
    still gets the outcome on its subscription, the command is acknowledged at its first
    delivery (nothing dead-lettered), and a later look-up reads the marker."""
    bucket = await vb.js.stream_info(f"KV_{vb.layout.outcomes_bucket}")
    bucket.config.sealed = True
    await vb.js.update_stream(bucket.config)
    [created] = await vb.apply(vm_manifest("web", "Halted"))
    [command_id] = await _command_ids(vb)
    await _eventually_consumed(vb, (await vb.js.stream_info(vb.layout.commands_stream))
                               .state.last_seq)
    consumer = await vb.js.consumer_info(vb.layout.commands_stream, COMMANDS_CONSUMER)
    assert consumer.num_redelivered == 0
    assert await dead_letters(vb) == []
    kv = await vb.js.key_value(vb.layout.outcomes_bucket)
    with pytest.raises(KeyNotFoundError):
        await kv.get(outcome_key(vb.actor, command_id))
    assert await vb.outcome(command_id, timeout=5) == created


@pytest.mark.parametrize("bucket", ["refusing", "gone"])
async def test_an_outcome_the_bucket_could_not_store_is_put_again_until_it_is(
        vb: Client, bucket: str) -> None:
    """The bucket refuses a command's outcome (its messages capped below the outcome's
    size) or leaves it unanswered (its stream gone, as one whose leader is being elected
    does): the client still gets its outcome, and the put is made again, a pause apart,
    until the bucket, set right, stores it, where a person who may not read the log looks
    a missed outcome up."""
    await vb.apply(vm_manifest("warm", "Halted"))  # the intake is up, its bucket bound
    stream = f"KV_{vb.layout.outcomes_bucket}"
    config = (await vb.js.stream_info(stream)).config
    if bucket == "refusing":
        await vb.js.update_stream(dataclasses.replace(config, max_msg_size=8))
    else:
        await vb.js.delete_stream(stream)
    [created] = await vb.apply(vm_manifest("web", "Halted"))
    if bucket == "refusing":
        await vb.js.update_stream(config)
    else:
        await ensure_all(vb.js, vb.layout)  # the bucket back, empty
    kv = await vb.js.key_value(vb.layout.outcomes_bucket)
    key = outcome_key(vb.actor, created.command_id)
    for _ in range(400):
        with contextlib.suppress(KeyNotFoundError):
            entry = await kv.get(key)
            assert entry.value is not None
            assert msgspec.msgpack.decode(entry.value, type=Outcome) == created
            return
        await asyncio.sleep(0.05)  # poll interval of a condition wait, not synchronisation
    raise AssertionError("the outcome was never put again")


async def _command_ids(vb: Client) -> list[str]:
    """The ids of the commands in the commands stream, in order."""
    msgs = await read_all(vb.nc, vb.layout.commands_stream, vb.layout.commands_filter)
    return [msgspec.msgpack.decode(m.data, type=Command).id for m in msgs]


async def test_strays_on_a_commands_marker_subject_leave_it_one_outcome(vb: Client) -> None:
    """Entries stored on a command's marker subject before the command comes (what a reply
    aimed there leaves, a copy of another command's marker, an event there that is no
    marker of this command) are strays: each reader skips them with their reason, and the
    command, decided or refused outright, gets one outcome, however often it comes, and one
    marker, appended past them."""
    [created] = await vb.apply(vm_manifest("web", "Halted"))
    [copied] = await read_all(vb.nc, vb.layout.events_stream,
                              marker_subject(vb, created.command_id))
    original = read_event(copied)
    assert original is not None
    start = vb.command("VirtualMachine", "start", "default", "web")
    refused = vb.command("Node", "register", name="n9")  # the intake's own refusal
    for command in (start, refused):
        subject = marker_subject(vb, command.id)
        headers = {TOPIC_HEADER: original.topic(), VERSION_HEADER: "1"}  # as a copy carries
        await vb.js.publish(subject, b'{"type":"io.nats.jetstream.api.v1.stream_info_response"}')
        await vb.js.publish(subject, encode(original), headers=headers)
        another = msgspec.structs.replace(original, originator_id=marker_aggregate(command.id))
        await vb.js.publish(subject, encode(another), headers=headers)

    outcomes = [await vb.run(start), await vb.run(refused, check=False)]
    assert outcomes[0].accepted and not outcomes[1].accepted, outcomes
    assert outcomes[1].field == "verb"
    for command in (start, refused):
        await publish_again(vb, command)
    await _eventually_consumed(vb, (await vb.js.stream_info(vb.layout.commands_stream))
                               .state.last_seq)
    for command, outcome in zip((start, refused), outcomes, strict=True):
        assert await vb.outcome(command.id) == outcome
        skipped: list[str] = []
        stored = await read_all(vb.nc, vb.layout.events_stream, marker_subject(vb, command.id))
        read = [read_event(m, on_skip=partial(_skipped, skipped)) for m in stored]
        assert skipped == [NO_TOPIC, MISPLACED, NOT_A_MARKER]
        assert read[:3] == [None] * 3 and len(read) == 4  # one marker, past the strays
        assert recorded_outcome(read[3], sequence(stored[3])) == outcome  # type: ignore[arg-type]


async def test_a_stray_after_a_marker_hides_no_outcome_gone_from_the_bucket(vb: Client) -> None:
    """Once its bucket entry has expired, an outcome is read from the first marker on the
    command's subject, not from whatever was stored there last."""
    [created] = await vb.apply(vm_manifest("web", "Halted"))
    [command_id] = await _command_ids(vb)
    await vb.js.publish(marker_subject(vb, command_id), b"a stray stored after the marker")
    kv = await vb.js.key_value(vb.layout.outcomes_bucket)
    await kv.purge(outcome_key(vb.actor, command_id))
    assert await vb.outcome(command_id, timeout=5) == created


async def test_the_intake_holds_no_more_than_its_concurrency_the_rest_wait_in_the_stream(
        nats_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the intake takes on beyond what it can work queues in this process, behind it
    the controllers' commands (a controller lag of seconds at 10,000 VMs): it asks the
    server for no more than it has free places, and for more as places free up. Its pulls
    last longer than the test waits, so the rest is not fetched by a pull's expiry."""
    monkeypatch.setattr("controlplane.intake.PULL_EXPIRES_SECONDS", 600.0)
    layout = Layout(prefix)
    nc = await connect(nats_url, "intake-bound")
    await ensure_all(nc.jetstream(), layout)
    sent = INTAKE_CONCURRENCY * 3
    for i in range(sent):
        await nc.jetstream().publish(layout.command_subject("user:dana", "vm", "apply"),
                                     str(i).encode())
    working, most, done = 0, 0, 0
    full, released, finished = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def work(_msg: object) -> None:
        nonlocal working, most, done
        working += 1
        most = max(most, working)
        if working == INTAKE_CONCURRENCY:
            full.set()
        await released.wait()
        working -= 1
        done += 1
        if done == sent:
            finished.set()

    stop = asyncio.Event()
    consumer = Consumer(nc, layout, stream=layout.commands_stream,
                        subject=layout.commands_filter, durable=COMMANDS_CONSUMER, work=work)
    running = asyncio.ensure_future(consumer.run(stop))
    try:
        await asyncio.wait_for(full.wait(), 10)
        # Every message the server handed out is being worked on: none waits in here.
        info = await nc.jetstream().consumer_info(layout.commands_stream, COMMANDS_CONSUMER)
        assert info.num_ack_pending == INTAKE_CONCURRENCY
        assert info.num_pending == sent - INTAKE_CONCURRENCY
        released.set()
        await asyncio.wait_for(finished.wait(), 10)
        assert most == INTAKE_CONCURRENCY
    finally:
        released.set()
        stop.set()
        await running
        await nc.close()


def _skipped(into: list[str], _sequence: int, reason: str) -> None:
    into.append(reason)


def marker_subject(vb: Client, command_id: str) -> str:
    return vb.layout.aggregate_subject(marker_aggregate(command_id))

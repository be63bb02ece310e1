"""The dispatcher is an outbox with a checkpoint: a restarted dispatcher does not publish
node work again for events it dispatched before, even past the node stream's duplicate
window (cut here to the server's minimum, 100 ms, and waited out)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as Nats
from nats.js.api import AckPolicy, ConsumerConfig, RawStreamMsg
from nats.js.errors import KeyNotFoundError, NotFoundError
from structlog.testing import capture_logs

from controlplane.controllers.dispatcher import CHECKPOINT_KEY, Dispatcher, WorkConsumers
from controlplane.loop import ControlLoop
from controlplane.writer import Writer
from events.jetstream.connect import connect
from events.jetstream.directget import read_all, sequence
from events.jetstream.streams import ensure_all, work_consumer, work_consumer_config
from events.language.messages import Command, NodeCommand
from events.language.subjects import Layout
from projections.cluster import ClusterState
from projections.follower import read_event
from tests.store.helpers import register_command
from tests.system.harness import eventually

WINDOW = 0.1
_decode_node_command = msgspec.msgpack.Decoder(NodeCommand).decode
SET_BY_THE_SERVER = ("deliver_policy", "max_waiting", "replay_policy", "num_replicas",
                     "inactive_threshold", "mem_storage", "metadata")


@pytest.fixture
async def nc(nats_url: str, prefix: str) -> AsyncIterator[Nats]:
    client = await connect(nats_url, "test-dispatcher")
    js = client.jetstream()
    await ensure_all(js, Layout(prefix))
    info = await js.stream_info(Layout(prefix).node_stream)
    info.config.duplicate_window = WINDOW
    await js.update_stream(info.config)
    try:
        yield client
    finally:
        await client.close()


async def dispatch_the_log(nc: Nats, layout: Layout,
                           dispatcher: Dispatcher | None = None) -> None:
    """One dispatcher's life: from its checkpoint over the whole log, as the control loop
    starts it."""
    dispatcher = dispatcher or Dispatcher(nc, layout)
    await dispatcher.load_checkpoint()
    await show_the_log(nc, layout, dispatcher)
    await dispatcher.flush()


async def show_the_log(nc: Nats, layout: Layout, dispatcher: Dispatcher) -> None:
    """Every event of the log to `dispatcher`, which queues the work of those past its
    position, as the control loop's follow does."""
    state = ClusterState()
    for msg in await read_all(nc, layout.events_stream, layout.events_filter()):
        event = read_event(msg)
        if event is not None:
            state.apply(event, sequence(msg))
            await dispatcher.on_event(sequence(msg), event, state)


def vmi_command(name: str, verb: str, manifest: dict[str, object]) -> Command:
    return Command(id=str(uuid.uuid4()), actor="system:controller:scheduler",
                   kind="VirtualMachineInstance", verb=verb, namespace="default", name=name,
                   manifest=manifest)


def vmi_manifest(name: str) -> dict[str, object]:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}}


async def node_work(nc: Nats, layout: Layout) -> list[RawStreamMsg]:
    """The node stream's messages, in order (it answers no Direct Get)."""
    js = nc.jetstream()
    last = (await js.stream_info(layout.node_stream)).state.last_seq
    return [await js.get_msg(layout.node_stream, seq) for seq in range(1, last + 1)]


async def checkpoint(nc: Nats, layout: Layout) -> int:
    try:
        entry = await (await nc.jetstream().key_value(layout.checkpoints_bucket)).get(
            CHECKPOINT_KEY)
    except KeyNotFoundError:
        return 0
    return int(entry.value or b"0")


async def test_a_restarted_dispatcher_publishes_nothing_twice(nc: Nats, prefix: str) -> None:
    layout = Layout(prefix)
    writer = Writer(nc, layout)
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": "web", "namespace": "default"},
           "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}}
    for command in (
        register_command("n1", devices=False),
        Command(id=str(uuid.uuid4()), actor="user:erin", kind="VirtualMachineInstance",
                verb="apply", namespace="default", name="web", manifest=vmi),
        Command(id=str(uuid.uuid4()), actor="system:controller:scheduler",
                kind="VirtualMachineInstance", verb="schedule", namespace="default",
                name="web", manifest={"node": "n1"}),
    ):
        assert (await writer.execute(command)).outcome.accepted
    await dispatch_the_log(nc, layout)
    js = nc.jetstream()
    assert (await js.stream_info(layout.node_stream)).state.messages == 1  # the launch
    await asyncio.sleep(WINDOW * 2)  # past the node stream's dedupe: only the checkpoint
    await dispatch_the_log(nc, layout)  # the control plane started again
    assert (await js.stream_info(layout.node_stream)).state.messages == 1


async def test_each_vmis_work_goes_out_in_the_logs_order_while_the_log_is_followed(
        nc: Nats, prefix: str) -> None:
    """Publishing runs on its own task, a batch at a time, VMIs side by side: each VMI's
    commands still go out in the log's order (its launch before its stop)."""
    layout = Layout(prefix)
    writer = Writer(nc, layout)
    names = [f"vmi-{i:02d}" for i in range(12)]
    for node in ("n1", "n2"):
        assert (await writer.execute(register_command(node, devices=False))).outcome.accepted
    for i, name in enumerate(names):
        for command in (vmi_command(name, "apply", vmi_manifest(name)),
                        vmi_command(name, "schedule", {"node": f"n{i % 2 + 1}"})):
            assert (await writer.execute(command)).outcome.accepted
    for name in names:
        deletion = Command(id=str(uuid.uuid4()), actor="user:erin",
                           kind="VirtualMachineInstance", verb="delete", namespace="default",
                           name=name)
        assert (await writer.execute(deletion)).outcome.accepted
    stop = asyncio.Event()
    dispatcher = Dispatcher(nc, layout)
    publishing = asyncio.ensure_future(dispatcher.run(stop))
    try:
        await dispatch_the_log(nc, layout, dispatcher)
    finally:
        stop.set()
        await publishing
    order = {str(read_event(m).id): sequence(m)  # type: ignore[union-attr]
             for m in await read_all(nc, layout.events_stream, layout.events_filter())}
    work = [(m.subject.split(".")[-2], _decode_node_command(m.data))  # type: ignore[union-attr]
            for m in await node_work(nc, layout)]
    assert sorted(c.verb for _, c in work) == ["launch"] * 12 + ["stop"] * 12
    for i, name in enumerate(names):
        node = f"n{i % 2 + 1}"
        mine = [(c.verb, order[c.event_id]) for n, c in work if n == node and c.name == name]
        assert [verb for verb, _ in mine] == ["launch", "stop"], name
        assert mine[0][1] < mine[1][1], name
    assert await checkpoint(nc, layout) == max(order.values())


async def test_a_nodes_vmis_are_dispatched_side_by_side(nc: Nats, prefix: str) -> None:
    """Twelve launches for one node in one batch are in flight together, not one round trip
    after another: a node given a hundred VMIs at once waited a hundred round trips."""
    layout = Layout(prefix)
    writer = Writer(nc, layout)
    assert (await writer.execute(register_command("n1", devices=False))).outcome.accepted
    for i in range(12):
        name = f"vmi-{i:02d}"
        for command in (vmi_command(name, "apply", vmi_manifest(name)),
                        vmi_command(name, "schedule", {"node": "n1"})):
            assert (await writer.execute(command)).outcome.accepted
    dispatcher = Dispatcher(nc, layout)
    publish = dispatcher.js.publish
    in_flight, peak = 0, 0

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            return await publish(*args, **kwargs)
        finally:
            in_flight -= 1

    dispatcher.js.publish = counted  # type: ignore[method-assign]
    await dispatch_the_log(nc, layout, dispatcher)
    assert len(await node_work(nc, layout)) == 12
    assert peak > 1


async def test_the_checkpoint_never_passes_work_nats_has_not_taken(
        nc: Nats, prefix: str) -> None:
    """With the node stream gone, the launch is tried again and again; a dispatcher stopped
    meanwhile leaves the checkpoint before it, so the next one publishes it."""
    layout = Layout(prefix)
    writer = Writer(nc, layout)
    dispatcher = Dispatcher(nc, layout)
    assert (await writer.execute(register_command("n1", devices=False))).outcome.accepted
    await dispatch_the_log(nc, layout, dispatcher)  # n1's consumer made, and known made
    for command in (vmi_command("web", "apply", vmi_manifest("web")),
                    vmi_command("web", "schedule", {"node": "n1"})):
        assert (await writer.execute(command)).outcome.accepted
    js = nc.jetstream()
    await js.delete_stream(layout.node_stream)
    stop = asyncio.Event()
    with capture_logs() as logs:
        publishing = asyncio.ensure_future(dispatcher.run(stop))
        following = asyncio.ensure_future(dispatch_the_log(nc, layout, dispatcher))
        try:
            async def retrying() -> bool:
                return any(r["event"].startswith("dispatching") for r in logs)

            await eventually(retrying, what="the launch tried again")
        finally:
            stop.set()
            await publishing
            await following
    assert await checkpoint(nc, layout) < (await js.stream_info(
        layout.events_stream)).state.last_seq
    await ensure_all(js, layout)
    await dispatch_the_log(nc, layout)
    [launch] = await node_work(nc, layout)
    assert _decode_node_command(launch.data).verb == "launch"


async def test_a_checkpoint_nats_cannot_take_is_saved_once_it_can(nc: Nats,
                                                                  prefix: str) -> None:
    """The checkpoints bucket answers nothing (here: it is gone; one electing its leader
    answers the same) when a batch has gone out: the save is tried again, one log line per
    attempt, and made once the bucket answers; the dispatcher never stops for it."""
    layout = Layout(prefix)
    writer = Writer(nc, layout)
    dispatcher = Dispatcher(nc, layout)
    assert (await writer.execute(register_command("n1", devices=False))).outcome.accepted
    await dispatch_the_log(nc, layout, dispatcher)  # the bucket bound, n1's consumer made
    for command in (vmi_command("web", "apply", vmi_manifest("web")),
                    vmi_command("web", "schedule", {"node": "n1"})):
        assert (await writer.execute(command)).outcome.accepted
    js = nc.jetstream()
    before = await checkpoint(nc, layout)
    await js.delete_stream(f"KV_{layout.checkpoints_bucket}")
    stop = asyncio.Event()
    with capture_logs() as logs:
        publishing = asyncio.ensure_future(dispatcher.run(stop))
        try:
            await show_the_log(nc, layout, dispatcher)

            async def retrying() -> bool:
                return any(r["event"].startswith("saving the dispatcher's checkpoint")
                           for r in logs)

            await eventually(retrying, what="the checkpoint tried again")
            await ensure_all(js, layout)  # the bucket answers again

            async def saved() -> bool:  # past the launch's event
                return await checkpoint(nc, layout) > before

            await eventually(saved, what="the checkpoint saved")
            assert not publishing.done()  # the dispatcher went on
        finally:
            stop.set()
            await publishing
    [launch] = await node_work(nc, layout)
    assert _decode_node_command(launch.data).verb == "launch"


async def test_the_control_plane_makes_each_nodes_work_consumer_and_makes_it_again(
        nc: Nats, prefix: str) -> None:
    """A node's registration makes its pull consumer; deleted, the control loop's check
    makes it again (the agent only binds to it)."""
    layout = Layout(prefix)
    js = nc.jetstream()
    writer = Writer(nc, layout)
    stop = asyncio.Event()
    running = asyncio.ensure_future(ControlLoop(nc, layout, writer).run(stop))

    async def made() -> bool:
        try:
            info = await js.consumer_info(layout.node_stream, work_consumer("n1"))
        except NotFoundError:
            return False
        assert info.config == work_consumer_config(layout, "n1").evolve(
            **{f: getattr(info.config, f) for f in SET_BY_THE_SERVER})
        return True

    try:
        assert (await writer.execute(register_command("n1", devices=False))).outcome.accepted
        await eventually(made, what="n1's consumer")
        await js.delete_consumer(layout.node_stream, work_consumer("n1"))
        await eventually(made, what="n1's consumer made again")
        assert not running.done()
    finally:
        stop.set()
        await running


async def test_node_work_left_unfinished_comes_again_before_any_later_item(
        nc: Nats, prefix: str) -> None:
    """An agent takes a node's first item and dies before acknowledging it; the agent
    started again is given that item again (after the ack wait), not the next one first."""
    layout = Layout(prefix)
    js = nc.jetstream()
    await ensure_all(js, layout)
    await WorkConsumers(nc, layout).ensure("n1")
    for verb in ("pause", "unpause"):
        await js.publish(layout.node_subject("n1", verb), verb.encode())
    died = await js.pull_subscribe_bind(durable=work_consumer("n1"), stream=layout.node_stream)
    [first] = await died.fetch(1, timeout=10)
    assert first.data == b"pause"
    await died.unsubscribe()  # never acknowledged
    again = await js.pull_subscribe_bind(durable=work_consumer("n1"), stream=layout.node_stream)
    [taken] = await again.fetch(1, timeout=30)
    assert (taken.data, taken.metadata.num_delivered) == (b"pause", 2)


async def test_a_push_consumer_in_a_nodes_place_is_made_afresh(nc: Nats, prefix: str) -> None:
    """A consumer under a node's name that is not the control plane's pull consumer (a push
    consumer made while agents still made their own) cannot be updated into one: it is
    deleted and made afresh, and the work waiting for it is kept."""
    layout = Layout(prefix)
    js = nc.jetstream()
    name = work_consumer("n1")
    await js.add_consumer(layout.node_stream, ConsumerConfig(
        name=name, durable_name=name, filter_subject=layout.node_filter("n1"),
        deliver_subject=f"elsewhere.{prefix}", ack_policy=AckPolicy.EXPLICIT))
    await js.publish(layout.node_subject("n1", "launch"), b"work")
    await WorkConsumers(nc, layout).ensure("n1")
    info = await js.consumer_info(layout.node_stream, name)
    assert info.config.deliver_subject is None and info.num_pending == 1

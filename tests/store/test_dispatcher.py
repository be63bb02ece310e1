"""The dispatcher is an outbox with a checkpoint: a restarted dispatcher does not publish
node work again for events it dispatched before, even past the node stream's duplicate
window (cut here to the server's minimum, 100 ms, and waited out)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client as Nats
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError

from controlplane.controllers.dispatcher import Dispatcher, WorkConsumers
from controlplane.loop import ControlLoop
from controlplane.writer import Writer
from events.connect import connect
from events.directget import read_all, sequence
from events.messages import Command
from events.streams import ensure_all, work_consumer, work_consumer_config
from events.subjects import Layout
from projections.cluster import ClusterState
from projections.follower import read_event
from tests.store.helpers import register_command
from tests.system.harness import eventually

WINDOW = 0.1
SET_BY_THE_SERVER = ("deliver_policy", "max_waiting", "replay_policy", "max_ack_pending",
                     "num_replicas", "inactive_threshold", "mem_storage", "metadata")


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


async def dispatch_the_log(nc: Nats, layout: Layout) -> None:
    """One dispatcher's life: from its checkpoint over the whole log, as the control loop
    starts it."""
    dispatcher = Dispatcher(nc, layout)
    await dispatcher.load_checkpoint()
    state = ClusterState()
    for msg in await read_all(nc, layout.events_stream, layout.events_filter()):
        event = read_event(msg)
        if event is not None:
            state.apply(event, sequence(msg))
            await dispatcher.on_event(sequence(msg), event, state)
    await dispatcher.flush()


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

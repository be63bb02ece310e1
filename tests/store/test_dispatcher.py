"""The dispatcher is an outbox with a checkpoint: a restarted dispatcher does not publish
node work again for events it dispatched before, even past the node stream's duplicate
window (cut here to the server's minimum, 100 ms, and waited out)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client as Nats

from controlplane.controllers.dispatcher import Dispatcher
from controlplane.writer import Writer
from events.connect import connect
from events.directget import read_all, sequence
from events.messages import Command
from events.streams import ensure_all
from events.subjects import Layout
from projections.cluster import ClusterState
from projections.follower import read_event
from tests.store.helpers import register_command

WINDOW = 0.1


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

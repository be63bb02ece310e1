"""What a NATS failure must not do, each on a real nats-server: kill the read service's
start-up (a transient failure while it waits for the streams), make a reader fold the whole
log (a snapshot list that timed out taken for no snapshot), go unnoticed for minutes (a
frozen server), make a dead node look fresh (a heartbeat replayed to a new watch),
dead-letter a message whose work was done (its claim could not be renewed), or keep a
service from stopping on a signal while NATS does not answer.

A server of a test's own is frozen (SIGSTOP) or killed; deadlines are safety nets against a
hang, never measurements."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from structlog.testing import capture_logs

import controlplane.intake
import events.runtime.aio
from controlplane.intake import Consumer
from controlplane.node.controller import NodeLifecycle
from events.jetstream.connect import connect
from events.jetstream.server import EmbeddedNats, free_port
from events.jetstream.streams import ensure_all, wait_for_streams
from events.language.subjects import Layout, encode_token
from projections.cluster import ClusterState
from projections.snapshots import Snapshots
from tests.system.harness import eventually
from tests.test_unreachable_nats import SAFETY_NET_SECONDS, _attempt, _no_traceback, _running

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A server of the test's own, to freeze or kill; thawed before it is stopped."""
    own = EmbeddedNats(tmp_path / "nats").start()
    try:
        yield own
    finally:
        if own.process is not None and own.process.poll() is None:
            own.process.send_signal(signal.SIGCONT)
        own.stop()


@contextlib.contextmanager
def frozen(server: EmbeddedNats) -> Iterator[None]:
    """The server stopped in its tracks (SIGSTOP): connections stay open, nothing answers."""
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.process.send_signal(signal.SIGCONT)


@pytest.fixture
async def installed(server: EmbeddedNats) -> AsyncIterator[tuple[Client, Layout]]:
    nc = await connect(server.url, "test-robustness")
    layout = Layout("rb")
    await ensure_all(nc.jetstream(), layout, 1)
    try:
        yield nc, layout
    finally:
        await nc.close()


def logged(logs: Sequence[Mapping[str, Any]], prefix: str) -> Callable[[], Awaitable[bool]]:
    """Whether a line starting with `prefix` was logged yet, for `eventually`."""
    async def seen() -> bool:
        return any(r["event"].startswith(prefix) for r in logs)
    return seen


# -- the read service's start-up ----------------------------------------------------------


async def test_waiting_for_the_streams_rides_out_a_server_that_does_not_answer(
        server: EmbeddedNats, installed: tuple[Client, Layout]) -> None:
    """The streams exist, but the server answers nothing for a while (as a cluster electing
    its leaders): each timeout is one log line and a retry within the wait's deadline,
    not the end of the read service's (or an agent's) start."""
    nc, layout = installed
    js = nc.jetstream(timeout=0.5)  # each request times out soon, so the test is short
    with capture_logs() as logs, frozen(server):
        waiting = asyncio.ensure_future(wait_for_streams(js, layout, timeout=60))
        retried = logged(logs, "waiting for the installation's streams")

        async def retried_or_ended() -> bool:
            return waiting.done() or await retried()

        await eventually(retried_or_ended, what="a retry")
        assert not waiting.done(), waiting.exception()
    await waiting  # the server answers again: the wait ends
    assert any(r.get("error", "").startswith("TimeoutError") for r in logs), logs


# -- a reader's start from a snapshot -----------------------------------------------------


async def test_a_snapshot_list_that_times_out_is_asked_again_not_taken_for_none(
        server: EmbeddedNats, installed: tuple[Client, Layout]) -> None:
    """A reader's start asks for the snapshots while the server answers nothing (a busy
    server, a leader being elected): the list that timed out is asked again, so the start
    folds from the snapshot, not from the log's start (at 10,000 VMs, 1.5 s against 10 s)."""
    nc, layout = installed
    with capture_logs() as logs:  # no bucket yet is an answer, not a failure to ask again
        assert await Snapshots(nc, Layout("uninstalled")).latest() is None
    assert not [r for r in logs if r["log_level"] != "debug"], logs
    state = ClusterState()
    state.last_sequence = 42
    assert await Snapshots(nc, layout).save(state)
    snapshots = Snapshots(nc, layout)
    with capture_logs() as logs, frozen(server):
        reading = asyncio.ensure_future(snapshots.latest())
        retried = logged(logs, "snapshots listed: NATS unavailable")

        async def retried_or_ended() -> bool:
            return reading.done() or await retried()

        await eventually(retried_or_ended, what="a retry")
        assert not reading.done(), reading.result()
    found = await reading
    assert found is not None and found.last_sequence == 42


# -- a frozen server ----------------------------------------------------------------------


async def test_a_connection_notices_a_frozen_server_by_its_pings(server: EmbeddedNats) -> None:
    """A server that stops answering (frozen; a half-dead host) is noticed by the
    connection's own pings, well before the safety net (nats-py's default pings every
    two minutes, and would not)."""
    lost = asyncio.Event()

    async def on_disconnected() -> None:
        lost.set()

    nc = await connect(server.url, "test-pings", disconnected_cb=on_disconnected)
    try:
        with frozen(server):
            await asyncio.wait_for(lost.wait(), SAFETY_NET_SECONDS)
    finally:
        await nc.close()


# -- heartbeats replayed to a new watch ---------------------------------------------------


async def beat_until_seen(nc: Client, layout: Layout, lifecycle: NodeLifecycle,
                          node: str) -> None:
    """Beat for `node` until the running watch has taken a beat of it: by then it has also
    taken everything stored before (a watch delivers in order)."""
    kv = await nc.jetstream().key_value(layout.heartbeats_bucket)
    before = lifecycle.last_seen.get(node)

    async def seen() -> bool:
        await kv.put(encode_token(node), b"beat")
        return lifecycle.last_seen.get(node, before) != before

    await eventually(seen, what=f"a beat of {node} seen")


@contextlib.asynccontextmanager
async def watching(lifecycle: NodeLifecycle) -> AsyncIterator[None]:
    stop = asyncio.Event()
    watch = asyncio.ensure_future(lifecycle.watch(stop))
    try:
        yield
    finally:
        stop.set()
        await watch


async def test_a_heartbeat_replayed_to_a_new_watch_refreshes_no_node(
        installed: tuple[Client, Layout]) -> None:
    """A node beats once and dies; the watch is set up again (NATS failed it): the last
    value it replays is no beat, so the dead node is not seen afresh."""
    nc, layout = installed
    lifecycle = NodeLifecycle(nc, layout)
    async with watching(lifecycle):
        await beat_until_seen(nc, layout, lifecycle, "dead")
    last_beat = lifecycle.last_seen["dead"]
    async with watching(lifecycle):  # the re-subscription
        await beat_until_seen(nc, layout, lifecycle, "alive")
    assert lifecycle.last_seen["dead"] == last_beat


async def test_a_heartbeat_stored_before_start_is_no_beat(
        installed: tuple[Client, Layout]) -> None:
    """A control plane that starts finds a dead node's last heartbeat in the bucket (it
    outlives the node by the bucket's TTL): that is no sign of life."""
    nc, layout = installed
    kv = await nc.jetstream().key_value(layout.heartbeats_bucket)
    await kv.put(encode_token("dead"), b"beat")
    lifecycle = NodeLifecycle(nc, layout)
    async with watching(lifecycle):
        await beat_until_seen(nc, layout, lifecycle, "alive")
    assert "dead" not in lifecycle.last_seen


# -- a claim that cannot be renewed -------------------------------------------------------

RENEWAL_ACK_WAIT_SECONDS = 1.5
"""The ack wait `claimed` renews against (a claim renewed every 0.5 s), short for a test, long
enough that a loaded machine stalling the loop for a second does not let it lapse."""
WORK_SECONDS = 5 * RENEWAL_ACK_WAIT_SECONDS / 3
"""How long the work takes while the server is gone: five renewals fail meanwhile."""


@pytest.mark.parametrize("back", ["before the ack", "after the ack"])
async def test_work_done_while_its_claim_cannot_be_renewed_is_not_dead_lettered(
        server: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        back: str) -> None:
    """The server goes away while a message is worked on, on its last delivery, so renewing
    its claim fails (here at once: the connection buffers nothing while it reconnects);
    the work itself succeeds. The server is back before the ack (then the message is
    acknowledged) or after it (the ack is lost: it may come again, to be answered from its
    marker). Either way it is not dead-lettered: the work's outcome decides."""
    monkeypatch.setattr(events.runtime.aio, "ACK_WAIT_SECONDS", RENEWAL_ACK_WAIT_SECONDS)
    monkeypatch.setattr(controlplane.intake, "MAX_DELIVER", 1)
    layout = Layout("rb")
    nc = await connect(server.url, "test-claims", pending_size=0)
    stop = asyncio.Event()
    running: asyncio.Future[None] | None = None
    deliveries: list[int] = []
    restarted: list[EmbeddedNats] = []

    async def restart() -> None:
        restarted.append(await asyncio.to_thread(
            EmbeddedNats(tmp_path / "nats", port=server.port).start))
        await eventually(lambda: now(nc.is_connected), what="the connection back")

    async def work(msg: Msg) -> None:
        deliveries.append(msg.metadata.num_delivered)
        await asyncio.to_thread(server.kill)
        await eventually(lambda: now(nc.is_reconnecting), what="the connection lost")
        await asyncio.sleep(WORK_SECONDS)  # the work's own duration, not a wait for anything
        if back == "before the ack":
            await restart()

    try:
        await ensure_all(nc.jetstream(), layout, 1)
        consumer = Consumer(nc, layout, stream=layout.commands_stream,
                            subject=layout.commands_filter, durable="test", work=work)
        with capture_logs() as logs:
            running = asyncio.ensure_future(consumer.run(stop))
            await nc.jetstream().publish(layout.command_subject("user:t", "vm", "apply"), b"x")
            if back == "before the ack":
                async def settled() -> bool:
                    info = await nc.jetstream().consumer_info(layout.commands_stream, "test")
                    return info.ack_floor is not None and info.ack_floor.stream_seq == 1
            else:
                async def settled() -> bool:  # the ack tried (or the message dead-lettered)
                    return any(r["event"] in ("intake could not settle a message",
                                              "message dead-lettered") for r in logs)

            await eventually(settled, what="the message settled")
            assert consumer.dead_letters == 0
            assert deliveries == [1]
            assert any(r["event"] == "claim of a work item not renewed" for r in logs)
        if back == "after the ack":
            await restart()
        dead = await nc.jetstream().stream_info(layout.dead_letter_stream)
        assert dead.state.messages == 0
    finally:
        stop.set()
        if running is not None:
            await running
        await nc.close()
        for again in restarted:
            again.stop()


async def test_work_longer_than_the_ack_wait_keeps_its_claim(
        server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch) -> None:
    """A message worked on for three ack waits has its claim renewed meanwhile (`claimed`),
    so the server does not hand it out again while it is worked on."""
    monkeypatch.setattr(events.runtime.aio, "ACK_WAIT_SECONDS", RENEWAL_ACK_WAIT_SECONDS)
    monkeypatch.setattr(controlplane.intake, "ACK_WAIT_SECONDS", RENEWAL_ACK_WAIT_SECONDS)
    layout = Layout("rk")
    nc = await connect(server.url, "test-claim-kept")
    stop = asyncio.Event()
    running: asyncio.Future[None] | None = None
    deliveries: list[int] = []

    async def work(msg: Msg) -> None:
        deliveries.append(msg.metadata.num_delivered)
        await asyncio.sleep(3 * RENEWAL_ACK_WAIT_SECONDS)  # the work's own duration

    async def settled() -> bool:
        info = await nc.jetstream().consumer_info(layout.commands_stream, "test")
        return info.ack_floor is not None and info.ack_floor.stream_seq == 1

    try:
        await ensure_all(nc.jetstream(), layout, 1)
        consumer = Consumer(nc, layout, stream=layout.commands_stream,
                            subject=layout.commands_filter, durable="test", work=work)
        running = asyncio.ensure_future(consumer.run(stop))
        await nc.jetstream().publish(layout.command_subject("user:t", "vm", "apply"), b"x")
        await eventually(settled, what="the message acknowledged")
        assert deliveries == [1]
    finally:
        stop.set()
        if running is not None:
            await running
        await nc.close()


async def now(value: bool) -> bool:
    """A condition read as it is now, for `eventually`."""
    return value


# -- a signal while NATS does not answer --------------------------------------------------


@pytest.mark.parametrize("module", ["controlplane", "projections"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_service_still_connecting_stops_on_a_signal(tmp_path: Path, module: str,
                                                      sig: signal.Signals) -> None:
    """The control plane and the read service, started while NATS is unreachable (their
    connection retries for ever), stop on Ctrl-C or SIGTERM: one line, status 0, no
    traceback."""
    dead_url = f"nats://127.0.0.1:{free_port()}"
    with _running(["-m", module, "run", "--nats-url", dead_url], tmp_path) as (proc, lines):
        lines.until(_attempt(dead_url, 1), "a first attempt")
        proc.send_signal(sig)
        assert proc.wait(timeout=SAFETY_NET_SECONDS) == 0
        output = lines.rest()
        _no_traceback(output)
        stopped = [line for line in output if "stopped before NATS answered" in line]
        assert len(stopped) == 1, output

"""A client awaiting outcomes while its connection is lost: an outcome stored meanwhile never
arrives on the client's subscription, so once connected again the client reads every outcome
it still awaits from the bucket (one check for the whole client), long before the commands'
own deadlines. The connection goes through a relay the test cuts; the server stays up."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgspec
import pytest

from controlplane.user.client import Client
from events.jetstream.connect import connect
from events.jetstream.streams import ensure_all
from events.language.messages import Outcome, outcome_key
from events.language.subjects import Layout
from tests.system.harness import eventually

ACTOR = "user:tess"
DEADLINE_SECONDS = 600.0
"""The commands' own wait: far past the test's, so only the re-check can answer in time."""


class Relay:
    """A TCP relay to the NATS server that can be cut: cut, it closes every connection
    through it and takes no new one until mended."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.cut = False
        self.port = 0
        self._open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.sever()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def sever(self) -> None:
        self.cut = True
        for writer in self._open:
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._open |= {writer, up_writer}
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        self._open -= {writer, up_writer}


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def relayed(nats_url: str) -> AsyncIterator[Relay]:
    host, _, port = nats_url.removeprefix("nats://").rpartition(":")
    relay = Relay(host, int(port))
    await relay.start()
    try:
        yield relay
    finally:
        await relay.stop()


async def done(task: asyncio.Future[Outcome]) -> Outcome | None:
    return task.result() if task.done() else None


@pytest.mark.parametrize("awaited", [1, 3])
async def test_outcomes_stored_while_the_connection_was_down_are_read_after_it(
        nats_url: str, prefix: str, awaited: int) -> None:
    layout = Layout(prefix)
    direct = await connect(nats_url, "test-direct")
    async with relayed(nats_url) as relay:
        nc = await connect(f"nats://127.0.0.1:{relay.port}", "test-client",
                           allow_reconnect=True, max_reconnect_attempts=-1,
                           reconnect_time_wait=0.1)
        vb = Client(nc, layout, ACTOR)
        try:
            await ensure_all(direct.jetstream(), layout, 1)
            commands = [vb.command("VirtualMachine", "start", "default", f"vm-{i}")
                        for i in range(awaited)]
            waiting = [asyncio.ensure_future(vb.run(c, check=False, timeout=DEADLINE_SECONDS))
                       for c in commands]

            async def submitted() -> bool:
                info = await direct.jetstream().stream_info(layout.commands_stream)
                return info.state.messages == awaited

            await eventually(submitted, what="the commands submitted")
            relay.sever()
            await eventually(lambda: _now(not nc.is_connected), what="the connection lost")
            outcomes = await direct.jetstream().key_value(layout.outcomes_bucket)
            stored = [Outcome(command_id=c.id, accepted=False, reason="test") for c in commands]
            for outcome in stored:
                await outcomes.put(outcome_key(ACTOR, outcome.command_id),
                                   msgspec.msgpack.encode(outcome))
            relay.cut = False
            await eventually(lambda: _now(nc.is_connected), what="the connection back")
            got = [await eventually(lambda t=task: done(t), what="the outcome read")
                   for task in waiting]
            assert got == stored
        finally:
            await vb.close()
            await direct.close()


async def _now(value: bool) -> bool:
    return value

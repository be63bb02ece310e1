"""A client awaiting its commands' outcomes, with no control plane: the test puts on the
outcomes' subjects what the control plane, or someone else, would. Only a command's own
outcome, as the control plane puts it, is taken; every caller awaiting one command hears
it; closing ends every wait at once; and the timeout ends a wait with its own clear error,
whatever the look-ups meet."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
from nats.aio.client import Client as Nats
from nats.errors import ConnectionClosedError

from controlplane.user.client import Client
from events.jetstream.connect import connect
from events.jetstream.streams import ensure_all
from events.language.messages import Command, Outcome, outcome_key
from events.language.subjects import Layout
from tests.system.harness import eventually

ACTOR = "user:tess"
LONG = 600.0
"""A command's own wait, far past the test's: only what the test checks can end it."""


@pytest.fixture
async def direct(nats_url: str, prefix: str) -> AsyncIterator[Nats]:
    """Another connection: the control plane's side, or someone else's."""
    nc = await connect(nats_url, "test-other")
    await ensure_all(nc.jetstream(), Layout(prefix), 1)
    try:
        yield nc
    finally:
        await nc.close()


@pytest.fixture
async def vb(nats_url: str, prefix: str, direct: Nats) -> AsyncIterator[Client]:
    client = Client(await connect(nats_url, "test-client"), Layout(prefix), ACTOR)
    try:
        yield client
    finally:
        await client.close()


def subject(vb: Client, command: Command) -> str:
    return f"$KV.{vb.layout.outcomes_bucket}.{outcome_key(ACTOR, command.id)}"


async def submitted(vb: Client, direct: Nats, count: int = 1) -> None:
    """Until the commands stream holds `count` commands: the client's subscription to its
    outcomes, made before its first publish, is then in place on the server."""
    async def there() -> bool:
        info = await direct.jetstream().stream_info(vb.layout.commands_stream)
        return info.state.messages >= count
    await eventually(there, what="the command submitted")


async def test_only_the_commands_own_outcome_as_put_is_taken(vb: Client, direct: Nats) -> None:
    """On the command's outcome subject, before its outcome: another command's outcome, a
    stored message aimed there as a reply (a Direct Get's answer carries `Nats-Sequence`),
    a delete. Each is ignored; the outcome put after them is the answer."""
    command = vb.command("VirtualMachine", "start", "default", "web")
    waiting = asyncio.ensure_future(vb.run(command, check=False, timeout=LONG))
    await submitted(vb, direct)
    forged = Outcome(command_id=command.id, accepted=True, sequences=[42])
    await direct.publish(subject(vb, command), msgspec.msgpack.encode(
        Outcome(command_id="another", accepted=True, sequences=[41])))
    await direct.publish(subject(vb, command), msgspec.msgpack.encode(forged),
                         headers={"Nats-Sequence": "42", "Nats-Subject": subject(vb, command)})
    await direct.publish(subject(vb, command), b"", headers={"KV-Operation": "DEL"})
    put = Outcome(command_id=command.id, accepted=False, reason="the control plane's")
    await direct.publish(subject(vb, command), msgspec.msgpack.encode(put))
    assert await waiting == put


async def test_every_caller_awaiting_one_command_hears_its_outcome(
        vb: Client, direct: Nats) -> None:
    """`run` and `outcome` await one command at once; its outcome is announced once and
    not stored (the bucket's stream is gone): both callers hear it."""
    command = vb.command("VirtualMachine", "start", "default", "web")
    running = asyncio.ensure_future(vb.run(command, check=False, timeout=5))
    await submitted(vb, direct)
    await direct.jetstream().delete_stream(f"KV_{vb.layout.outcomes_bucket}")
    awaiting = asyncio.ensure_future(vb.outcome(command.id, timeout=5))

    async def both_await() -> bool:
        return len(vb._awaited.get(subject(vb, command), ("", []))[1]) == 2
    await eventually(both_await, what="both callers awaiting")
    put = Outcome(command_id=command.id, accepted=False, reason="the control plane's")
    await direct.publish(subject(vb, command), msgspec.msgpack.encode(put))
    assert await asyncio.gather(running, awaiting) == [put, put]
    assert vb._awaited == {}, "every caller's wait forgotten"


async def test_closing_the_client_ends_every_wait_at_once(vb: Client, direct: Nats) -> None:
    command = vb.command("VirtualMachine", "start", "default", "web")
    waiting = asyncio.ensure_future(vb.run(command, check=False, timeout=LONG))
    await submitted(vb, direct)
    await vb.close()
    # Bounded only so that a wait that never ends fails here, not at the suite's timeout.
    with pytest.raises(ConnectionClosedError):
        await asyncio.wait_for(waiting, 60)


async def test_the_timeout_ends_a_wait_with_its_own_error(vb: Client, direct: Nats) -> None:
    """Nothing answers and nothing can be looked up (the bucket gone: each look-up fails,
    and is tried again for seconds): the caller hears that its timeout passed, in one line,
    not what the last look-up met."""
    await direct.jetstream().delete_stream(f"KV_{vb.layout.outcomes_bucket}")
    command = vb.command("VirtualMachine", "start", "default", "web")
    with pytest.raises(TimeoutError, match=f"^no outcome for command {command.id} after 0.5s"):
        await vb.run(command, check=False, timeout=0.5)

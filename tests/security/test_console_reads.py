"""A VMI's serial console, read through the read service (`projections.console`): only by who
the policy grants `get` of `virtualmachineinstances/console` in the VMI's namespace (KubeVirt's
edit and admin roles, not view), and only what the node the cluster placed the VMI on
published for its current instance."""

from __future__ import annotations

import asyncio
import uuid

import msgspec

from controlplane.user.client import Client
from controlplane.writer import Writer
from events.jetstream.streams import CONSOLE_CHUNKS_PER_GUEST
from events.language.messages import Command, DomainObservation, node_actor
from events.language.query import FORBIDDEN, NOT_FOUND, ConsoleAnswer, ConsoleQuery, ask_verb
from projections.console import CONSOLE_PAGE
from tests.security.test_tenancy import Reads, reads
from tests.system.harness import WAIT_SECONDS, eventually

__all__ = ["reads"]  # a fixture, used by name


async def _console(reads: Reads, asker: str, namespace: str, name: str,
                   since: int = 0) -> ConsoleAnswer:
    return await ask_verb(reads.nc, reads.layout, asker, "console",
                          ConsoleQuery(namespace=namespace, name=name, since=since),
                          answer=ConsoleAnswer)


async def _publish(reads: Reads, node: str, uid: str, data: bytes) -> None:
    subject = reads.layout.console_subject(node, "tenant-a", "on-n1", uid)
    await reads.nc.jetstream().publish(subject, data)


async def test_the_console_is_read_by_who_may_and_only_its_nodes_output(reads: Reads) -> None:
    [vmi] = await reads.items("operator", "VirtualMachineInstance", "tenant-a", "on-n1")
    uid = vmi["metadata"]["uid"]
    await _publish(reads, "n1", "an-earlier-instance", b"old instance\n")
    await _publish(reads, "n2", uid, b"another node speaking for it\n")
    await _publish(reads, "n1", uid, b"login: ")
    await _publish(reads, "n1", uid, b"root\n")

    for asker in ("alice", "operator"):  # edit in tenant-a; cluster-admin
        answer = await _console(reads, asker, "tenant-a", "on-n1")
        assert (answer.error, answer.output, answer.more) == ("", b"login: root\n", False)
    later = await _console(reads, "alice", "tenant-a", "on-n1", since=answer.next)
    assert (later.output, later.next) == (b"", answer.next)
    await _publish(reads, "n1", uid, b"$ ")
    assert (await _console(reads, "alice", "tenant-a", "on-n1", answer.next)).output == b"$ "

    for asker, namespace in (("bob", "tenant-a"), ("alice", "tenant-b"),
                             ("system:node:n1", "tenant-a")):
        refused = await _console(reads, asker, namespace, "on-n1")
        assert (refused.reason, refused.output) == (FORBIDDEN, b""), asker
    assert (await _console(reads, "bob", "tenant-a", "on-n1")).error == (
        "forbidden: User 'bob' cannot get resource \"virtualmachineinstances/console\" in API "
        'group "subresources.kubevirt.io" in the namespace "tenant-a"')
    missing = await _console(reads, "alice", "tenant-a", "nothing")
    assert (missing.reason, missing.error) == (
        NOT_FOUND, 'virtualmachineinstance "tenant-a/nothing" not found')
    nameless = await _console(reads, "alice", "tenant-a", "")
    assert nameless.error == "name: a console names one VMI and its namespace"


async def test_a_long_console_comes_in_pages(reads: Reads, nats_url: str, prefix: str) -> None:
    [vmi] = await reads.items("operator", "VirtualMachineInstance", "tenant-a", "on-n1")
    lines = [f"line {i}\n".encode() for i in range(CONSOLE_PAGE + 3)]
    assert len(lines) < CONSOLE_CHUNKS_PER_GUEST
    for line in lines:
        await _publish(reads, "n1", vmi["metadata"]["uid"], line)
    first = await _console(reads, "alice", "tenant-a", "on-n1")
    assert (first.output, first.more) == (b"".join(lines[:CONSOLE_PAGE]), True)
    rest = await _console(reads, "alice", "tenant-a", "on-n1", first.next)
    assert (rest.output, rest.more) == (b"".join(lines[CONSOLE_PAGE:]), False)
    client = await Client.connect(nats_url, prefix, actor="alice")
    try:  # the client reads every page, without being told to follow
        assert [o async for o in client.console("tenant-a", "on-n1")] == [first.output,
                                                                           rest.output]
    finally:
        await client.close()


async def test_a_followed_console_goes_on_until_its_vmi_is_finished(
        reads: Reads, nats_url: str, prefix: str) -> None:
    [vmi] = await reads.items("operator", "VirtualMachineInstance", "tenant-a", "on-n1")
    uid = vmi["metadata"]["uid"]
    await _publish(reads, "n1", uid, b"first\n")
    client = await Client.connect(nats_url, prefix, actor="alice")
    got: list[bytes] = []

    async def follow() -> None:
        async for output in client.console("tenant-a", "on-n1", follow=True):
            got.append(output)

    following = asyncio.ensure_future(follow())
    try:
        await eventually(lambda: _true(got == [b"first\n"]), what="the first output")
        await _publish(reads, "n1", uid, b"second\n")
        await eventually(lambda: _true(got == [b"first\n", b"second\n"]), what="more output")
        assert not following.done()
        gone = DomainObservation(namespace="tenant-a", name="on-n1", uid=uid, phase="Failed",
                                 gone=True)
        done = await Writer(reads.nc, reads.layout).execute(Command(
            id=str(uuid.uuid4()), actor=node_actor("n1"), kind="VirtualMachineInstance",
            verb="observe", namespace="tenant-a", name="on-n1",
            manifest=msgspec.to_builtins(gone)))
        assert done.outcome.accepted, done.outcome.reason
        await asyncio.wait_for(following, WAIT_SECONDS)
    finally:
        following.cancel()
        await client.close()


async def _true(value: bool) -> bool:
    return value

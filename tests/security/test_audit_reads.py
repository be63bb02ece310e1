"""A person who may not read the event log (it holds every namespace and cloud-init secrets
in clear) still watches, audits and reads the past, through the read service, as the policy
lets it (issue 8): on a real nats-server running the shipped `deploy/nats/accounts.conf`,
each process and person under its own NATS identity. alice edits tenant-a, bob views it;
tenant-b is neither's. The HTTP API answers as the user a bearer token names."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from nats.aio.client import Client as Nats

from controlplane.user.client import Client
from controlplane.writer import Writer
from events.api.errors import Forbidden
from events.authorization.accounts import ADMIN_USER, CONTROLPLANE_USER, PROJECTIONS_USER
from events.authorization.policy import load_policy
from events.jetstream.streams import ensure_all
from events.language.messages import Command
from events.language.query import FORBIDDEN, Answer, Query, query_subject
from events.language.subjects import Layout
from projections import http
from projections.http import StaticTokens
from projections.service import FORBIDDEN_REASON, MALFORMED, QUERIES_REFUSED, REDACTED, ReadService
from tests.security.conftest import PASSWORD, connect_as
from tests.system.harness import vm_manifest

POLICY = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "policy.yaml"
SECRET = "#cloud-config\npassword: hunter2\n"
TOKENS = {"alice": "alice-token", "operator": "operator-token"}


def _vm(namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    manifest = vm_manifest("web", "Halted")
    manifest["metadata"] = {"name": "web", "namespace": namespace, "labels": labels or {}}
    spec = manifest["spec"]["template"]["spec"]
    spec["domain"]["devices"]["disks"] = [{"name": "cloudinit", "disk": {"bus": "virtio"}}]
    spec["volumes"] = [{"name": "cloudinit", "cloudInitNoCloud": {"userData": SECRET}}]
    return manifest


class Installation:
    """The shipped accounts: streams made by `admin`, the control plane's writer, the read
    service (and its HTTP API) as `projections` with the shipped policy; people connect with
    their own identities."""

    def __init__(self, url: str, writer: Writer, service: ReadService, port: int) -> None:
        self.url, self.writer, self.service, self.port = url, writer, service, port
        self.layout = service.layout
        self.applied: dict[str, list[int]] = {"tenant-a": [], "tenant-b": []}
        self.correlation: dict[str, str] = {}

    async def apply(self, namespace: str, labels: dict[str, str] | None = None) -> int:
        command = Command(id=str(uuid.uuid4()), actor="operator", kind="VirtualMachine",
                          verb="apply", manifest=_vm(namespace, labels))
        result = await self.writer.execute(command)
        assert result.outcome.accepted, result.outcome.reason
        self.correlation.setdefault(namespace, command.id)  # its first apply
        sequence = int(result.events[-1][0])
        self.applied[namespace].append(sequence)
        return sequence

    async def client(self, user: str) -> Client:
        return await Client.connect(self.url.replace("nats://", f"nats://{user}:{PASSWORD}@"))

    def refused(self, reason: str) -> float:
        return self.service.registry.get_sample_value(
            f"{QUERIES_REFUSED}_total", {"reason": reason}) or 0.0


@pytest.fixture
async def install(secured_nats: str, tmp_path: Path) -> AsyncIterator[Installation]:
    layout = Layout()
    opened: list[Nats] = []

    async def as_role(user: str) -> Nats:
        nc, _ = await connect_as(secured_nats, user)
        opened.append(nc)
        return nc

    await ensure_all((await as_role(ADMIN_USER)).jetstream(), layout)
    writer = Writer(await as_role(CONTROLPLANE_USER), layout)
    token_file = tmp_path / "tokens.csv"
    token_file.write_text("".join(f'{token},{user},{user}-uid,"group1,group2"\n'
                                  for user, token in TOKENS.items()))
    service = ReadService(await as_role(PROJECTIONS_USER), layout, load_policy(POLICY),
                          StaticTokens.load(token_file))
    stop = asyncio.Event()
    task = asyncio.ensure_future(service.run(stop))
    runner = await http.serve(service.state, service, "127.0.0.1", 0, service.tokens)
    [(_, port, *_)] = runner.addresses
    out = Installation(secured_nats, writer, service, port)
    try:
        await out.apply("tenant-a")
        await out.apply("tenant-b")
        await out.apply("tenant-a", {"tier": "gold"})
        await out.apply("tenant-b", {"tier": "gold"})
        yield out
    finally:
        await runner.cleanup()
        stop.set()
        await task
        await asyncio.gather(*(nc.close() for nc in opened))


def _secrets(entries: object) -> bytes:
    """Everything an answer holds, as bytes to look for a secret in."""
    return msgspec.json.encode(entries)


async def test_history_shows_what_the_policy_lets_each_read(install: Installation) -> None:
    alice, bob, operator = [await install.client(u) for u in ("alice", "bob", "operator")]
    try:
        mine = await alice.history("VirtualMachine", "tenant-a", "web")
        assert [e.sequence for e in mine] == install.applied["tenant-a"]
        assert {e.actor for e in mine} == {"operator"}
        assert mine[0].correlation_id == install.correlation["tenant-a"] != ""
        # the label, and status stamped with the event's time where it fell in another second
        assert "/metadata/labels" in [c["path"] for c in mine[1].changes]
        assert b"hunter2" in _secrets(mine[0].changes)  # she may change it

        viewed = await bob.history("VirtualMachine", "tenant-a", "web")
        assert [e.sequence for e in viewed] == install.applied["tenant-a"]
        assert REDACTED.encode() in _secrets(viewed[0].changes)
        assert b"hunter2" not in _secrets(viewed)

        for person in (alice, bob):
            with pytest.raises(Forbidden, match='in the namespace "tenant-b"'):
                await person.history("VirtualMachine", "tenant-b", "web")
            assert await person.correlated(install.correlation["tenant-b"]) == []
        assert install.refused(FORBIDDEN_REASON) == 2
        trail = await alice.correlated(install.correlation["tenant-a"])
        assert {e.object for e in trail} == {"vm.tenant-a.web"}
        assert [e.sequence for e in await operator.history("VirtualMachine", "tenant-b", "web")
                ] == install.applied["tenant-b"]
    finally:
        await asyncio.gather(alice.close(), bob.close(), operator.close())


async def test_get_at_a_point_shows_her_namespace_only(install: Installation) -> None:
    alice, bob = await install.client("alice"), await install.client("bob")
    try:
        first_b = install.applied["tenant-b"][0]
        [then] = await alice.query_at(first_b, "VirtualMachine")
        assert (then["metadata"]["namespace"], then["metadata"].get("labels", {})) == (
            "tenant-a", {})  # before her second apply, and nothing of tenant-b's
        for at in (install.applied["tenant-b"][-1], datetime.now(UTC)):  # an instant too
            now = await alice.query_at(at, "VirtualMachine")
            assert [(v["metadata"]["namespace"], v["metadata"]["labels"]) for v in now] == [
                ("tenant-a", {"tier": "gold"})]
        [viewed] = await bob.query_at(first_b, "VirtualMachine", "tenant-a", "web")
        volume = viewed["spec"]["template"]["spec"]["volumes"][0]
        assert volume["cloudInitNoCloud"]["userData"] == REDACTED
        with pytest.raises(Forbidden):
            await alice.query_at(first_b, "VirtualMachine", "tenant-b")
    finally:
        await asyncio.gather(alice.close(), bob.close())


async def test_a_watch_replays_and_follows_her_namespace_only(install: Installation) -> None:
    alice = await install.client("alice")
    try:
        head = install.applied["tenant-b"][-1]
        changes = alice.watch("VirtualMachine", since=1)
        replayed = [await anext(changes) for _ in install.applied["tenant-a"]]
        assert [c.sequence for c in replayed] == install.applied["tenant-a"]
        assert {(c.namespace, c.name) for c in replayed} == {("tenant-a", "web")}
        assert replayed[-1].object is not None
        assert replayed[-1].object["metadata"]["labels"] == {"tier": "gold"}
        # Live: tenant-b changes first, then tenant-a; she is shown only the second.
        written_b = await install.apply("tenant-b", {"tier": "silver"})
        written_a = await install.apply("tenant-a", {"tier": "silver"})
        live = await asyncio.wait_for(anext(changes), 30)
        assert (live.sequence, live.namespace) == (written_a, "tenant-a")
        await changes.aclose()

        # Resumed from a point: the same changes from there on, none before.
        resumed = alice.watch("VirtualMachine", "tenant-a", "web", since=head)
        assert (await anext(resumed)).sequence == written_a
        await resumed.aclose()
        assert written_b not in {c.sequence for c in replayed}
        with pytest.raises(Forbidden):
            await anext(alice.watch("VirtualMachine", "tenant-b", since=1))
    finally:
        await alice.close()


async def test_hostile_queries_are_refused_counted_and_answered(
        install: Installation) -> None:
    """Malformed bodies, a sequence before the log, an unknown kind or verb: an answer with
    the error, counted, and the service answers the next query as before."""
    layout = install.layout
    nc, _ = await connect_as(install.url, "alice")
    alice = await install.client("alice")
    try:
        for verb in ("get", "history", "watch", "bogus"):
            reply = await nc.request(f"{layout.query_root}.alice.{verb}", b"\xc1junk",
                                     timeout=10)
            assert msgspec.msgpack.decode(reply.data, type=Answer).error
        with pytest.raises(RuntimeError, match="since: must be a sequence from 1"):
            await anext(alice.watch("VirtualMachine", since=0))
        with pytest.raises(RuntimeError, match="no such kind"):
            await alice.history("Nonsense" * 100, "tenant-a", "web")
        assert install.refused(MALFORMED) == 6
        answer = msgspec.msgpack.decode((await nc.request(
            query_subject(layout, "alice"), msgspec.msgpack.encode(Query(
                kind="VirtualMachine", namespace="tenant-b")), timeout=10)).data, type=Answer)
        assert (answer.reason, answer.items) == (FORBIDDEN, [])
        assert [v["metadata"]["namespace"] for v in await alice.query("VirtualMachine")] == [
            "tenant-a"]
    finally:
        await asyncio.gather(nc.close(), alice.close())


async def test_the_http_api_answers_as_the_tokens_user(install: Installation) -> None:
    base = f"http://127.0.0.1:{install.port}"
    vms = "/apis/kubevirt.io/v1/virtualmachines"

    async def get(session: aiohttp.ClientSession, path: str,
                  token: str | None = None) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with session.get(base + path, headers=headers) as response:
            return response.status, await response.text()

    alice = await install.client("alice")
    try:  # once this answers, the read model has folded every event written
        await alice.get("VirtualMachine", "tenant-a", "web",
                        after=install.applied["tenant-b"][-1])
    finally:
        await alice.close()
    async with aiohttp.ClientSession() as session:
        code, body = await get(session, vms, TOKENS["alice"])
        assert code == 200
        items = msgspec.json.decode(body)["items"]
        assert [v["metadata"]["namespace"] for v in items] == ["tenant-a"]
        code, body = await get(session, vms, TOKENS["operator"])
        assert [v["metadata"]["namespace"] for v in msgspec.json.decode(body)["items"]] == [
            "tenant-a", "tenant-b"]
        assert (await get(session, vms, "wrong-token"))[0] == 401
        assert (await get(session, "/metrics", "wrong-token"))[0] == 401
        code, body = await get(session, vms)  # anonymous: what the policy grants it
        assert code == 200 and msgspec.json.decode(body)["items"] == []
        assert (await get(session, "/metrics"))[0] == 403
        assert (await get(session, "/metrics", TOKENS["alice"]))[0] == 403
        code, body = await get(session, "/metrics", TOKENS["operator"])
        assert code == 200 and "# TYPE" in body
        assert (await get(session, "/healthz"))[0] == 200


def _cli(install: Installation, credentials: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`virtbus ARGS` as the credentials' user, with no context file to fall back on."""
    return subprocess.run([sys.executable, "-m", "controlplane.user.cli", "--nats-url",
                           install.url, "--nats-credentials", str(credentials), *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "VIRTBUS_CONTEXT": str(credentials.parent / "none")})


async def test_the_cli_reads_the_past_as_she_may(install: Installation, tmp_path: Path) -> None:
    """The same commands as an operator's, answered as alice may see them."""
    credentials = tmp_path / "alice.json"
    credentials.write_text(json.dumps({"user": "alice", "password": PASSWORD}))
    credentials.chmod(0o600)
    run = partial(asyncio.to_thread, _cli, install, credentials)
    history = await run("history", "vm", "web", "-n", "tenant-a", "-o", "json")
    assert history.returncode == 0, history.stderr
    assert [e["sequence"] for e in json.loads(history.stdout)] == install.applied["tenant-a"]
    past = await run("get", "vm", "-A", "--at", str(install.applied["tenant-b"][-1]),
                     "-o", "json")
    assert past.returncode == 0, past.stderr
    assert [v["metadata"]["namespace"] for v in json.loads(past.stdout)["items"]] == [
        "tenant-a"]
    refused = await run("history", "vm", "web", "-n", "tenant-b")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: forbidden: User 'alice' cannot get resource")


async def test_an_http_watch_shows_what_the_tokens_user_may_watch(
        install: Installation) -> None:
    base = f"http://127.0.0.1:{install.port}/apis/kubevirt.io/v1"
    headers = {"Authorization": f"Bearer {TOKENS['alice']}"}
    alice = await install.client("alice")
    try:  # once this answers, the read model has folded every event written
        await alice.get("VirtualMachine", "tenant-a", "web",
                        after=install.applied["tenant-b"][-1])
    finally:
        await alice.close()
    async with aiohttp.ClientSession() as session:
        async def watch(path: str, token: dict[str, str]) -> tuple[int, list[Any]]:
            async with session.get(f"{base}{path}?watch=true&timeoutSeconds=1",
                                   headers=token) as r:
                text = await r.text()  # the stream ends after its timeout
            if r.status != 200:
                return r.status, [json.loads(text)]
            return r.status, [json.loads(line) for line in text.splitlines()]

        code, refused = await watch("/namespaces/tenant-b/virtualmachines", headers)
        assert code == 403 and refused[0]["reason"] == "Forbidden", refused
        code, refused = await watch("/namespaces/tenant-a/virtualmachines", {})  # anonymous
        assert code == 403, refused
        code, events = await watch("/namespaces/tenant-a/virtualmachines", headers)
        assert code == 200 and [(e["type"], e["object"]["metadata"]["namespace"])
                                for e in events] == [("ADDED", "tenant-a")], events
        code, events = await watch("/virtualmachines", headers)  # every namespace: hers
        assert code == 200 and [e["object"]["metadata"]["namespace"]
                                for e in events] == ["tenant-a"], events

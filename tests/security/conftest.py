"""A real nats-server on the shipped `deploy/nats/accounts.conf`, and connections to it as
each role: shared by the tests that try the permissions as an attacker would."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from events.authorization.accounts import ADMIN_USER, CONTROLPLANE_USER, PROJECTIONS_USER
from events.authorization.policy import load_policy
from events.jetstream.connect import connect
from events.jetstream.server import EmbeddedNats
from events.jetstream.streams import ensure_all
from events.language.subjects import Layout
from projections.service import ReadService

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ACCOUNTS_CONF = DEPLOY / "nats" / "accounts.conf"
POLICY = DEPLOY / "nats" / "policy.yaml"
SHORT = 1.0
"""How long a request the server refuses is given: it is dropped, so it times out."""
WEB, OTHER = "vm.default.web", "vm.default.other"
# `$NAME` outside quotes: an environment variable the server must be given.
_ENV_REF = re.compile(r'^[^"#\n]*?\$([A-Za-z_][A-Za-z0-9_]*)', re.MULTILINE)
PASSWORD = "test-password"

Refusals = list[str]


def env_for(*texts: str) -> dict[str, str]:
    """The environment a server on these config texts needs: each variable they name, set
    to `PASSWORD`."""
    names = {name for text in texts for name in _ENV_REF.findall(text)}
    return {**os.environ, **dict.fromkeys(names, PASSWORD)}


async def connect_as(url: str, user: str) -> tuple[Client, Refusals]:
    """A one-shot connection as `user` (password `PASSWORD`), and the server's asynchronous
    refusals (permission violations) as they arrive."""
    refusals: Refusals = []

    async def on_error(e: Exception) -> None:
        refusals.append(str(e))

    nc = await connect(url.replace("nats://", f"nats://{user}:{PASSWORD}@"), user,
                       error_cb=on_error, allow_reconnect=False)
    return nc, refusals


def serve_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 accounts_text: str) -> Iterator[str]:
    """A server on `accounts_text` (included from a server config); its passwords are in
    the environment it inherits."""
    (tmp_path / "accounts.conf").write_text(accounts_text)
    (tmp_path / "server.conf").write_text("include ./accounts.conf\n")
    for name, value in env_for(accounts_text).items():
        monkeypatch.setenv(name, value)
    with EmbeddedNats(tmp_path / "data", config=tmp_path / "server.conf") as server:
        yield server.url


@pytest.fixture
def secured_nats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A server on the shipped accounts.conf."""
    yield from serve_config(tmp_path, monkeypatch, ACCOUNTS_CONF.read_text())


async def refused(refusals: Refusals, subject: str, op: Callable[[], Awaitable[Any]]) -> None:
    """`op` fails, and the server said why: a permissions violation naming `subject`."""
    # The server drops a refused message and says so asynchronously; the request times out.
    with pytest.raises(Exception):  # noqa: B017
        await op()
    expected = f'permissions violation for publish to "{subject}"'.lower()
    assert any(expected in r.lower() for r in refusals), refusals


class Store:
    """The STORE account's side, running on the shipped config: streams made by `admin`,
    one event appended by the control plane, the real read service answering queries; and
    connections as anyone, closed at the end."""

    def __init__(self, url: str, layout: Layout) -> None:
        self.url, self.layout = url, layout
        self.opened: list[Client] = []
        self.read_service: Client | None = None
        self.reads: ReadService | None = None
        """The read service answering on `read_service`, in this process."""

    async def connect(self, user: str) -> tuple[Client, Refusals]:
        nc, refusals = await connect_as(self.url, user)
        self.opened.append(nc)
        return nc, refusals

    async def stored(self, cp: Client) -> dict[str, int]:
        """How many messages each stream and bucket holds, as `cp` sees them."""
        js, layout = cp.jetstream(), self.layout
        names = [layout.events_stream, layout.commands_stream, layout.reports_stream,
                 layout.node_stream, *(f"KV_{b}" for b in (
                     layout.heartbeats_bucket, layout.applied_bucket, layout.outcomes_bucket))]
        return {name: (await js.stream_info(name)).state.messages for name in names}


@pytest.fixture
async def store(secured_nats: str) -> AsyncIterator[Store]:
    store = Store(secured_nats, Layout())
    try:
        admin, _ = await store.connect(ADMIN_USER)
        await ensure_all(admin.jetstream(), store.layout)
        cp, _ = await store.connect(CONTROLPLANE_USER)
        await cp.jetstream().publish(store.layout.aggregate_subject(WEB), b"{}")
        store.read_service, _ = await store.connect(PROJECTIONS_USER)
        store.reads = ReadService(store.read_service, store.layout, load_policy(POLICY))
        await store.reads.listen()
        yield store
    finally:
        await asyncio.gather(*(nc.close() for nc in store.opened))

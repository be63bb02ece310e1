from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from nats.aio.client import Client as Nats

from events.jetstream.connect import connect
from events.language.subjects import Layout
from tests.store.helpers import SyncHandler


@pytest.fixture
def handler(nats_url: str, prefix: str) -> Iterator[SyncHandler]:
    """The control plane's command handler on a fresh prefix of the real store."""
    sync = SyncHandler(nats_url, Layout(prefix))
    try:
        yield sync
    finally:
        sync.close()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Nats]:
    """A connection of the test's own to the shared server."""
    connection = await connect(nats_url, "test")
    try:
        yield connection
    finally:
        await connection.close()

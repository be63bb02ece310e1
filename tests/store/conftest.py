from __future__ import annotations

from collections.abc import Iterator

import pytest

from events.subjects import Layout
from tests.store.helpers import SyncHandler


@pytest.fixture
def handler(nats_url: str, prefix: str) -> Iterator[SyncHandler]:
    """The control plane's command handler on a fresh prefix of the real store."""
    sync = SyncHandler(nats_url, Layout(prefix))
    try:
        yield sync
    finally:
        sync.close()

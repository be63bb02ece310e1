from __future__ import annotations

from collections.abc import Iterator

import pytest

from controlplane.handling import CommandHandler
from controlplane.writer import application
from events.subjects import Layout


@pytest.fixture
def handler(nats_url: str, prefix: str) -> Iterator[CommandHandler]:
    """The control plane's command handler on a fresh prefix of the real store."""
    app = application(nats_url, Layout(prefix))
    try:
        yield CommandHandler(app)
    finally:
        app.factory.close()

"""One nats-server per test session, for tests written as unittest cases and as pytest tests."""

from __future__ import annotations

import atexit
import functools
import tempfile
from pathlib import Path

from events.server import EmbeddedNats


@functools.cache
def shared_server() -> EmbeddedNats:
    server = EmbeddedNats(Path(tempfile.mkdtemp(prefix="virtbus-nats-"))).start()
    atexit.register(server.stop)
    return server

"""One nats-server per test session, for tests written as unittest cases and as pytest tests."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from events.server import EmbeddedNats


@functools.cache
def shared_server() -> EmbeddedNats:
    data = Path(tempfile.mkdtemp(prefix="virtbus-nats-"))
    atexit.register(shutil.rmtree, data, ignore_errors=True)  # runs after the stop below
    server = EmbeddedNats(data).start()
    atexit.register(server.stop)
    return server

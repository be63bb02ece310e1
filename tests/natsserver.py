"""One nats-server per test session, for tests written as unittest cases and as pytest tests;
and a small cluster, for what only replication shows."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from nats.errors import NoRespondersError
from nats.js.client import JetStreamContext
from nats.js.errors import ServiceUnavailableError

from events.server import EmbeddedNats, free_port


@functools.cache
def shared_server() -> EmbeddedNats:
    data = Path(tempfile.mkdtemp(prefix="virtbus-nats-"))
    atexit.register(shutil.rmtree, data, ignore_errors=True)  # runs after the stop below
    server = EmbeddedNats(data).start()
    atexit.register(server.stop)
    return server


@contextlib.contextmanager
def cluster(root: Path, size: int = 3) -> Iterator[list[EmbeddedNats]]:
    """A JetStream cluster of `size` servers on free loopback ports, each routing to all."""
    routes = [free_port() for _ in range(size)]
    servers: list[EmbeddedNats] = []
    try:
        for i, route in enumerate(routes):
            data = root / f"n{i}"
            data.mkdir(parents=True)
            conf = data / "server.conf"
            urls = "\n".join(f"    nats-route://127.0.0.1:{port}" for port in routes)
            conf.write_text(f"server_name: n{i}\ncluster {{\n  name: test\n"
                            f"  listen: 127.0.0.1:{route}\n  routes: [\n{urls}\n  ]\n}}\n")
            servers.append(EmbeddedNats(data, config=conf).start())
        yield servers
    finally:
        for server in servers:
            server.stop()


async def jetstream_ready(js: JetStreamContext, timeout: float = 30.0) -> None:
    """Wait until the cluster has elected its JetStream meta leader (it answers then)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await js.account_info()
            return
        except (ServiceUnavailableError, NoRespondersError, TimeoutError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)  # polling a cluster that is still electing

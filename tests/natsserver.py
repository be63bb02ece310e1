"""One nats-server per test session, for tests written as unittest cases and as pytest tests;
and a small cluster, for what only replication shows."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import shutil
import socket
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js.client import JetStreamContext
from nats.js.errors import ServiceUnavailableError

from events.jetstream.server import EmbeddedNats


@functools.cache
def shared_server() -> EmbeddedNats:
    data = Path(tempfile.mkdtemp(prefix="virtbus-nats-"))
    atexit.register(shutil.rmtree, data, ignore_errors=True)  # runs after the stop below
    server = EmbeddedNats(data).start()
    atexit.register(server.stop)
    return server


SYSTEM_USER = "sys"
"""User (and password) of the system account in a cluster made with `system_account`."""
_ACCOUNTS = """accounts {
  SYS: { users: [{user: sys, password: sys}] }
  APP: { jetstream: enabled, users: [{user: app, password: app}] }
}
system_account: SYS
no_auth_user: app
"""
"""Anonymous clients land in APP (as without accounts); `sys` may use the system API."""


class Member(EmbeddedNats):
    """A server of a `cluster`: its name there, and its monitoring endpoint."""

    def __init__(self, data_dir: Path, *, name: str, config: Path, port: int,
                 monitor_port: int) -> None:
        super().__init__(data_dir, config=config, port=port)
        self.name = name
        self.monitor_port = monitor_port

    @property
    def system_url(self) -> str:
        """This server as the system account's user (a cluster made with `system_account`)."""
        return f"nats://{SYSTEM_USER}:{SYSTEM_USER}@{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def monitor(self, endpoint: str) -> dict[str, Any]:
        """A monitoring endpoint's JSON (`jsz`, `connz`, ...)."""
        url = f"http://{self.host}:{self.monitor_port}/{endpoint}"
        with urllib.request.urlopen(url, timeout=5) as reply:
            found: dict[str, Any] = json.load(reply)
            return found


def distinct_free_ports(count: int) -> list[int]:
    """`count` free loopback ports, all different: each is held while the next is picked
    (picked one at a time and released, a server's client port could be another's route
    port, and the second server would fail to bind)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


@contextlib.contextmanager
def cluster(root: Path, size: int = 3, *,
            system_account: bool = False) -> Iterator[list[Member]]:
    """A JetStream cluster of `size` servers on free loopback ports, each routing to all,
    each with its monitoring endpoint; with `system_account`, a system account's user
    (`Member.system_url`) may move the JetStream meta leader (`lead_from`)."""
    ports = distinct_free_ports(3 * size)
    routes, clients, monitors = ports[:size], ports[size:2 * size], ports[2 * size:]
    servers: list[Member] = []
    try:
        for i, route in enumerate(routes):
            data = root / f"n{i}"
            data.mkdir(parents=True)
            conf = data / "server.conf"
            urls = "\n".join(f"    nats-route://127.0.0.1:{port}" for port in routes)
            monitor = monitors[i]
            conf.write_text(f"server_name: n{i}\nhttp: 127.0.0.1:{monitor}\n"
                            f"cluster {{\n  name: test\n"
                            f"  listen: 127.0.0.1:{route}\n  routes: [\n{urls}\n  ]\n}}\n"
                            + (_ACCOUNTS if system_account else ""))
            servers.append(Member(data, name=f"n{i}", config=conf, port=clients[i],
                                  monitor_port=monitor).start())
        yield servers
    finally:
        for server in servers:
            server.stop()


def meta_leader(servers: list[Member]) -> Member | None:
    """The server that leads the JetStream meta group now, as a live member sees it."""
    for server in servers:
        if server.alive():
            with contextlib.suppress(OSError, ValueError):
                name = server.monitor("jsz").get("meta_cluster", {}).get("leader")
                return next((s for s in servers if s.name == name), None)
    return None


def holding(servers: list[Member], connection: str) -> Member | None:
    """The live server that holds the client connection named `connection`."""
    for server in servers:
        if server.alive():
            names = {c.get("name") for c in server.monitor("connz?limit=1024")["connections"]}
            if connection in names:
                return server
    return None


async def lead_from(servers: list[Member], target: Member, nc: Client, streams: list[str],
                    timeout: float = 60.0) -> None:
    """Make `target` the JetStream meta leader and the leader of every stream in `streams`
    and of each of their durable consumers, so that killing `target` takes every leader
    at once. Each move is asked for and then waited for (a preferred-leader stepdown)."""
    ask = json.dumps({"placement": {"preferred": target.name}}).encode()
    deadline = asyncio.get_running_loop().time() + timeout
    js = nc.jetstream()
    system = Client()
    await system.connect(target.system_url, allow_reconnect=False)
    try:
        moves: list[tuple[str, str, str]] = [("meta", "", "")]
        for stream in streams:
            moves.append(("stream", stream, ""))
            moves += [("consumer", stream, c.name)
                      for c in await js.consumers_info(stream) if c.config.durable_name]
        for what, stream, consumer in moves:
            while await _leader(servers, js, what, stream, consumer) != target.name:
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"{what} {stream} {consumer} would not move to "
                                       f"{target.name}")
                subject = {"meta": "$JS.API.META.LEADER.STEPDOWN",
                           "stream": f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}",
                           "consumer": f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}",
                           }[what]
                with contextlib.suppress(TimeoutError, NoRespondersError):
                    await (system if what == "meta" else nc).request(subject, ask, timeout=5)
                await asyncio.sleep(0.2)  # polling the election the stepdown started
    finally:
        await system.close()


async def _leader(servers: list[Member], js: JetStreamContext, what: str, stream: str,
                  consumer: str) -> str | None:
    with contextlib.suppress(TimeoutError, NoRespondersError, ServiceUnavailableError):
        if what == "meta":
            found = await asyncio.to_thread(meta_leader, servers)
            return found.name if found else None
        info = await (js.stream_info(stream) if what == "stream"
                      else js.consumer_info(stream, consumer))
        return info.cluster.leader if info.cluster else None
    return None


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

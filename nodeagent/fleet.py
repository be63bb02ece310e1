"""Many simulated nodes in one process: `python -m nodeagent fleet --nodes 100`.

A simulated node as its own process costs some 60 MB, so a fleet of a hundred could not run
on one machine. Here each node is still a whole `NodeAgent` (its own work consumer,
heartbeat, reports, `sim` subject and simulated host kept in `<state dir>/<node>.xml`, so a
restarted fleet adopts its guests), but all of them share the process, its one NATS
connection, one asyncio loop and one small thread pool for libvirt calls. Each node opens
its own test-driver host (the file): every `test:///default` of a process is one shared
host, which would make a hundred nodes see each other's guests.

A node agent that fails is started again on its own after `FLEET_RESTART_SECONDS`; the
others go on. Real hosts keep one agent each (`python -m nodeagent run`).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import structlog
from nats.aio.client import Client

from events.jetstream.connect import Access, connect
from events.language.subjects import DEFAULT_PREFIX
from events.runtime.aio import pause_unless_stopped
from nodeagent.agent import NodeAgent
from nodeagent.config import AgentConfig
from nodeagent.converter import defaults as converter_defaults
from nodeagent.defaults import (
    DEVICE_PLUGIN_CAPACITY,
    FLEET_LIBVIRT_THREADS,
    FLEET_NODE_PREFIX,
    FLEET_RESTART_SECONDS,
    TEST_DEFAULT_URI,
)

log = structlog.get_logger(__name__)


class FleetConfig(msgspec.Struct, frozen=True, kw_only=True):
    access: Access
    prefix: str = DEFAULT_PREFIX
    nodes: int
    first: int = 1
    """The number of the first node (`node-<first>`), so fleets can share an installation."""
    state_dir: Path
    """Where each node's simulated host is kept (`<state dir>/<node>.xml`)."""
    cpus: int = 0
    """Each node's CPUs; 0 keeps the test driver's 16."""
    memory: int = 0
    """Each node's memory in bytes; 0 keeps the test driver's 3 GiB."""
    kvm_devices: int = DEVICE_PLUGIN_CAPACITY
    tun_devices: int = DEVICE_PLUGIN_CAPACITY
    disk_dir: str = converter_defaults.DISK_DIR

    def node_names(self) -> list[str]:
        return [f"{FLEET_NODE_PREFIX}{i}" for i in range(self.first, self.first + self.nodes)]

    def agent(self, node: str) -> AgentConfig:
        a = self.access
        return AgentConfig(node=node, nats_url=a.url, nats_credentials=a.credentials,
                           nats_ca=a.ca, nats_cert=a.cert, nats_key=a.key, prefix=self.prefix,
                           libvirt_uri=TEST_DEFAULT_URI, kvm_devices=self.kvm_devices,
                           tun_devices=self.tun_devices, disk_dir=self.disk_dir,
                           sim_state=str(self.state_dir / f"{node}.xml"),
                           sim_cpus=self.cpus, sim_memory=self.memory)


class Fleet:
    """The fleet's agents on one connection; `started` once every one has started."""

    def __init__(self, cfg: FleetConfig) -> None:
        self.cfg = cfg
        self.started = asyncio.Event()
        self.agents: dict[str, NodeAgent] = {n: NodeAgent(cfg.agent(n))
                                             for n in cfg.node_names()}
        """The agent now serving each node (a new one after a failure)."""

    async def run(self, stop: asyncio.Event) -> None:
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=FLEET_LIBVIRT_THREADS, thread_name_prefix="libvirt"))
        nc = await connect(self.cfg.access, f"fleet-{self.cfg.prefix}")
        try:
            first = list(self.agents.values())
            all_started = asyncio.ensure_future(
                asyncio.gather(*(a.started.wait() for a in first)))
            all_started.add_done_callback(lambda _: self.started.set())
            log.info("fleet starting", nodes=len(first), state_dir=str(self.cfg.state_dir))
            try:
                await asyncio.gather(*(self._serve(node, stop, nc) for node in self.agents))
            finally:
                all_started.cancel()
        finally:
            await nc.close()

    async def _serve(self, node: str, stop: asyncio.Event, nc: Client) -> None:
        """One node's agent until `stop`; one that fails is logged and started again (as a
        supervisor restarts an agent process), the fleet's other nodes unaffected."""
        while not stop.is_set():
            agent = self.agents[node]
            try:
                await agent.run(stop, nc=nc)
                return
            except Exception:
                log.exception("node agent failed; starting it again", node=node)
            await pause_unless_stopped(stop, FLEET_RESTART_SECONDS)
            self.agents[node] = NodeAgent(self.cfg.agent(node))

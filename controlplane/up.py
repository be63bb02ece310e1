"""`virtbus up`: everything on one machine. An embedded nats-server (or an existing one), the
control plane, the read service and N node agents, each its own process, restarted if it
dies, so `kill -9` of any of them is survivable by design."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import structlog

from controlplane.context import Context, write_context
from controlplane.defaults import NODE_MONITOR_GRACE_SECONDS
from events.connect import connect
from events.server import EmbeddedNats, free_port
from events.streams import ensure_all
from events.subjects import DEFAULT_PREFIX, Layout

log = structlog.get_logger(__name__)

RESTART_BACKOFF_SECONDS = 1.0
TEST_DRIVER_URI = "test:///default"
"""libvirt's simulated host; its agents keep it in `<data dir>/hosts/<node>.xml`."""


class UpOptions(msgspec.Struct, frozen=True, kw_only=True):
    data_dir: Path
    nodes: int = 2
    nats_port: int = 0
    nats_url: str = ""
    prefix: str = DEFAULT_PREFIX
    libvirt_uri: str = TEST_DRIVER_URI
    replicas: int = 1
    node_grace_seconds: float = NODE_MONITOR_GRACE_SECONDS
    http_port: int = 0
    """The HTTP read API's port on 127.0.0.1; 0 picks a free one."""


class Child:
    """One supervised process with its log file."""

    def __init__(self, name: str, args: list[str], logs: Path) -> None:
        self.name = name
        self.args = args
        self.log_path = logs / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> None:
        env = {**os.environ, "VIRTBUS_LOG_FORMAT": "json", "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen([sys.executable, *self.args], stdout=out,
                                            stderr=subprocess.STDOUT, env=env)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def children(opts: UpOptions, url: str, logs: Path, http_port: int) -> list[Child]:
    common = ["--nats-url", url, "--prefix", opts.prefix]
    out = [
        Child("controlplane", ["-m", "controlplane", "run", *common,
                               "--replicas", str(opts.replicas),
                               "--node-grace", str(opts.node_grace_seconds)], logs),
        Child("projections", ["-m", "projections", "run", *common,
                              "--listen", f"127.0.0.1:{http_port}"], logs),
    ]
    for i in range(1, opts.nodes + 1):
        out.append(Child(f"node-{i}", agent_args(f"node-{i}", common, opts.libvirt_uri,
                                                 opts.data_dir), logs))
    return out


def agent_args(node: str, common: list[str], libvirt_uri: str, data_dir: Path) -> list[str]:
    """A node agent's arguments: disks under `data_dir/disks` and, on the test driver, the
    simulated host kept in `data_dir/hosts/<node>.xml`, so an agent killed and restarted (or
    a whole `up` stopped and started) finds its guests as on a real hypervisor."""
    args = ["-m", "nodeagent", "run", *common, "--node", node, "--libvirt-uri", libvirt_uri,
            "--disk-dir", str(data_dir / "disks")]
    if libvirt_uri == TEST_DRIVER_URI:
        args += ["--sim-state", str(data_dir / "hosts" / f"{node}.xml")]
    return args


def up(opts: UpOptions) -> int:
    opts.data_dir.mkdir(parents=True, exist_ok=True)
    logs = opts.data_dir / "logs"
    logs.mkdir(exist_ok=True)
    server: EmbeddedNats | None = None
    url = opts.nats_url
    if not url:
        server = EmbeddedNats(opts.data_dir / "nats", port=opts.nats_port).start()
        url = server.url
    layout = Layout(opts.prefix)
    try:
        asyncio.run(_prepare(url, layout, opts.replicas))
    except BaseException:  # Unreachable above all: no server of ours left behind
        if server is not None:
            server.stop()
        raise
    http_port = opts.http_port or free_port()
    procs = children(opts, url, logs, http_port)
    for child in procs:
        child.start()
    path = write_context(Context(nats_url=url, prefix=opts.prefix, data_dir=str(opts.data_dir)))
    print(f"virtbus is up\n  NATS:      {url} (prefix {opts.prefix})\n"
          f"  HTTP:      http://127.0.0.1:{http_port}/apis/kubevirt.io/v1/virtualmachines"
          f" (and /metrics)\n"
          f"  data:      {opts.data_dir}\n  logs:      {logs}/\n  context:   {path}\n"
          f"  nodes:     {', '.join(c.name for c in procs if c.name.startswith('node-'))}\n"
          "Try: virtbus apply -f examples/vm-cirros.yaml && virtbus get vm\n"
          "Ctrl-C stops everything.", flush=True)
    stopping = False

    def stop(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while not stopping:
            for child in procs:
                if not child.alive() and not stopping:
                    child.restarts += 1
                    log.warning("restarting", process=child.name, restarts=child.restarts)
                    child.start()
            time.sleep(RESTART_BACKOFF_SECONDS)  # supervision period
    finally:
        for child in reversed(procs):
            child.stop()
        if server is not None:
            server.stop()
    return 0


async def _prepare(url: str, layout: Layout, replicas: int) -> None:
    """Streams and buckets, before any child starts; `Unreachable` (one sentence) if no
    server of `url` answers: a person is waiting, so `up` does not retry for ever."""
    nc = await connect(url, "virtbus-up", allow_reconnect=False)
    try:
        await ensure_all(nc.jetstream(), layout, replicas)
    finally:
        await nc.close()

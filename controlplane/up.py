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
from controlplane.defaults import FLEET_MIN_NODES, NODE_MONITOR_GRACE_SECONDS, TEST_DRIVER_URI
from controlplane.secured import OPERATOR_USER, Secured, secure
from events.jetstream.connect import Access
from events.jetstream.server import EmbeddedNats, free_port
from events.jetstream.streams import prepare_streams
from events.language.subjects import DEFAULT_PREFIX, Layout

log = structlog.get_logger(__name__)

RESTART_BACKOFF_SECONDS = 1.0


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
    secure: bool = False
    """TLS, one NATS identity per process and person, and the policy enforced
    (`controlplane.secured`)."""
    policy: Path | None = None
    """The RBAC policy of a secured installation (default: the operator may do all)."""
    fleet: bool = False
    """Simulated nodes in one fleet process even when fewer than `FLEET_MIN_NODES`."""
    node_cpus: int = 0
    """Each simulated node's CPUs and memory (bytes) in a fleet; 0 keeps the test driver's."""
    node_memory: int = 0

    @property
    def uses_fleet(self) -> bool:
        """Whether the nodes run as one fleet: simulated, sized or many, and not secured (a
        fleet shares one NATS identity, where a secured node may speak only for itself)."""
        asked = self.fleet or self.nodes >= FLEET_MIN_NODES or self.node_cpus or self.node_memory
        return bool(asked) and self.libvirt_uri == TEST_DRIVER_URI and not self.secure


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


def node_names(opts: UpOptions) -> list[str]:
    return [f"node-{i}" for i in range(1, opts.nodes + 1)]


def _listed(names: list[str], shown: int = 5) -> str:
    return ", ".join(names) if len(names) <= shown else f"{names[0]} ... {names[-1]}"


def children(opts: UpOptions, url: str, logs: Path, http_port: int,
             secured: Secured | None = None) -> list[Child]:
    common = ["--nats-url", url, "--prefix", opts.prefix]

    def login(credentials: str) -> list[str]:
        """A process's own identity: paths only, the secrets stay in the files."""
        return ["--nats-credentials", credentials, "--nats-ca", secured.ca] if secured else []

    decides = ["--policy", secured.policy] if secured else []
    out = [
        Child("controlplane", ["-m", "controlplane", "run", *common,
                               *login(secured.controlplane if secured else ""), *decides,
                               "--replicas", str(opts.replicas),
                               "--node-grace", str(opts.node_grace_seconds)], logs),
        Child("projections", ["-m", "projections", "run", *common,
                              *login(secured.projections if secured else ""), *decides,
                              *(["--token-auth-file", secured.http_tokens] if secured else []),
                              "--listen", f"127.0.0.1:{http_port}"], logs),
    ]
    if opts.uses_fleet:
        out.append(Child("fleet", fleet_args(opts, common), logs))
        return out
    for node in node_names(opts):
        own = login(secured.node_credentials(node) if secured else "")
        out.append(Child(node, agent_args(node, [*common, *own], opts.libvirt_uri,
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


def fleet_args(opts: UpOptions, common: list[str]) -> list[str]:
    """The fleet's arguments: its hosts kept where single agents keep theirs, so an
    installation may switch between the two and keep its guests."""
    return ["-m", "nodeagent", "fleet", *common, "--nodes", str(opts.nodes),
            "--state-dir", str(opts.data_dir / "hosts"),
            "--disk-dir", str(opts.data_dir / "disks"),
            *(["--cpu", str(opts.node_cpus)] if opts.node_cpus else []),
            *(["--memory", str(opts.node_memory)] if opts.node_memory else [])]


def _announce(opts: UpOptions, url: str, http_port: int, logs: Path, *, context: Path,
              secured: Secured | None) -> None:
    """Where everything listens, what security is on, and how to start."""
    fleet = " (one fleet process)" if opts.uses_fleet else ""
    security = (f"TLS, you are {OPERATOR_USER!r}, policy {secured.policy}, HTTP bearer "
                f"tokens in {secured.http_tokens}" if secured
                else "open: no TLS, no identities, every user may do everything")
    print(f"virtbus is up\n  NATS:      {url} (prefix {opts.prefix})\n"
          f"  security:  {security}\n"
          f"  HTTP:      http://127.0.0.1:{http_port}/apis/kubevirt.io/v1/virtualmachines"
          f" (and /metrics)\n"
          f"  data:      {opts.data_dir}\n  logs:      {logs}/\n  context:   {context}\n"
          f"  nodes:     {_listed(node_names(opts))}{fleet}\n"
          "Try: virtbus apply -f examples/vm-cirros.yaml && virtbus get vm\n"
          "Ctrl-C stops everything.", flush=True)


def up(opts: UpOptions) -> int:
    opts.data_dir.mkdir(parents=True, exist_ok=True)
    logs = opts.data_dir / "logs"
    logs.mkdir(exist_ok=True)
    server: EmbeddedNats | None = None
    url = opts.nats_url
    layout = Layout(opts.prefix)
    secured = secure(opts.data_dir, layout, node_names(opts), opts.policy) \
        if opts.secure else None
    if not url:
        server = EmbeddedNats(opts.data_dir / "nats", port=opts.nats_port,
                              tls=secured.server if secured else None,
                              extra_config=secured.server_config if secured else "").start()
        url = server.url
    admin = Access(url, credentials=secured.admin, ca=secured.ca) if secured else Access(url)
    try:
        asyncio.run(prepare_streams(admin, layout, opts.replicas))
    except BaseException:  # Unreachable above all: no server of ours left behind
        if server is not None:
            server.stop()
        raise
    http_port = opts.http_port or free_port()
    procs = children(opts, url, logs, http_port, secured)
    for child in procs:
        child.start()
    path = write_context(Context(nats_url=url, prefix=opts.prefix, data_dir=str(opts.data_dir),
                                 credentials=secured.operator if secured else "",
                                 ca=secured.ca if secured else ""))
    _announce(opts, url, http_port, logs, context=path, secured=secured)
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

"""The whole system under test: control plane, read service and node agents, each its own
process (as `virtbus up` runs them, agents with the same arguments: simulated hosts kept in
`<tmp>/hosts/`), on the session's nats-server with a fresh prefix."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from controlplane.up import UpOptions, children
from controlplane.user.client import Client
from events.jetstream.datastore import TOPIC_HEADER
from events.jetstream.directget import PAGE, direct_batch
from events.jetstream.server import free_port
from events.language.kinds.nodes import NodeNotReady, NodeReady
from events.language.messages import DomainSummary, SimReply, SimRequest
from projections.follower import head

T = TypeVar("T")

WAIT_SECONDS = 30.0
NODE_GRACE_SECONDS = 3.0
"""An agent silent this long makes its node NotReady (a test module may set its own
`NODE_GRACE_SECONDS`, which the `system` fixture takes)."""


async def eventually(probe: Callable[[], Awaitable[T | None]], timeout: float = WAIT_SECONDS,
                     what: str = "condition") -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = await probe()
        except Exception as e:
            last = e
        else:
            if value:
                return value
        await asyncio.sleep(0.05)  # poll interval of a condition wait, not synchronisation
    detail = f" (last error: {last})" if last else ""
    raise AssertionError(f"timed out waiting for {what}{detail}")


RUNNING: list[System] = []
"""Systems started and not yet stopped, for a failed test's report (`exits`)."""


class System:
    def __init__(self, nats_url: str, prefix: str, logs: Path, nodes: int = 2,
                 node_grace: float = NODE_GRACE_SECONDS, **up_options: Any) -> None:
        self.nats_url = nats_url
        self.prefix = prefix
        self.logs = logs
        self.node_grace = node_grace
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.args: dict[str, list[str]] = {}
        self.env: dict[str, dict[str, str]] = {"controlplane": {"VIRTBUS_REPLICA": "cp-a"}}
        self.entered: dict[str, list[str]] = {}
        self.killed: set[str] = set()
        """Processes the test signalled to end (`kill`), as against those that died."""
        """A command prefix a process runs under (e.g. `nsenter` into a host's namespaces)."""
        self.http_port = free_port()
        # The command lines `virtbus up` runs, with `logs` as its data directory.
        up = UpOptions(data_dir=logs, nodes=nodes, prefix=prefix, node_grace_seconds=node_grace,
                       **up_options)
        for child in children(up, nats_url, logs, self.http_port):
            self.args[child.name] = child.args
            if child.name.startswith("node-"):
                self.args[child.name] += ["--host-cpu-model", "Haswell-noTSX"]

    def add_replica(self, name: str) -> None:
        """Another control-plane process, standing by for the lease."""
        self.args[name] = self.args["controlplane"]
        self.env[name] = {"VIRTBUS_REPLICA": name}

    def start(self, name: str) -> None:
        if not self.procs:
            RUNNING.append(self)
        self.killed.discard(name)
        env = {**os.environ, "VIRTBUS_LOG_FORMAT": "json", "PYTHONUNBUFFERED": "1",
               **self.env.get(name, {})}
        with (self.logs / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                [*self.entered.get(name, []), sys.executable, *self.args[name]], stdout=out,
                stderr=subprocess.STDOUT, env=env)

    def start_all(self) -> None:
        for name in self.args:
            self.start(name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.killed.add(name)
        proc = self.procs[name]
        proc.send_signal(sig)
        proc.wait(timeout=20)

    def freeze(self, name: str) -> None:
        """Stop process `name` where it stands (SIGSTOP): alive, connected, and silent, as a
        hung or partitioned process is."""
        self.procs[name].send_signal(signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGCONT)

    def exits(self) -> list[str]:
        """One line per process no longer running: a process that died unbidden leaves a
        test waiting on something else, and this names it."""
        return [f"{name}: exited with {proc.returncode}"
                + (" (killed by the test)" if name in self.killed else " (unexpectedly)")
                for name, proc in self.procs.items() if proc.poll() is not None]

    def stop_all(self) -> None:
        if self in RUNNING:
            RUNNING.remove(self)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a frozen one would not take its SIGTERM
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def last_sequence(vb: Client) -> int:
    """The event log's head: a test compares it before and after to see what was appended."""
    return await head(vb.nc, vb.layout)


async def topics_since(vb: Client, sequence: int) -> list[str]:
    """The topics of the events appended after `sequence`, in order."""
    msgs = await direct_batch(vb.nc, vb.layout.events_stream, sequence + 1, PAGE,
                              vb.layout.events_filter())
    return [(m.headers or {})[TOPIC_HEADER] for m in msgs]


HEARTBEAT_JUDGEMENTS = frozenset({NodeReady.topic(), NodeNotReady.topic()})
"""A beat that arrives late under load has the control plane judge its node NotReady (and
Ready again): appends of the nodes' own, not of the commands a test is about."""


async def command_topics_since(vb: Client, sequence: int) -> list[str]:
    """`topics_since` but for the heartbeat judgements, which come and go with load."""
    return [t for t in await topics_since(vb, sequence) if t not in HEARTBEAT_JUDGEMENTS]


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """`obj`'s status condition of type `kind`, if it reports one."""
    return next((c for c in obj["status"]["conditions"] if c["type"] == kind), None)


def is_ready(node: dict[str, Any]) -> bool:
    """The Node's Ready condition (every node reports one) is True."""
    ready = condition(node, "Ready")
    assert ready is not None, node
    return bool(ready["status"] == "True")


async def ready_nodes(vb: Client, count: int) -> list[dict[str, Any]] | None:
    ready = [n for n in await vb.query("Node") if is_ready(n)]
    return ready if len(ready) >= count else None


async def node_ready(vb: Client, node: str, ready: bool) -> bool:
    """Whether Node `node` is Ready is `ready`."""
    [obj] = await vb.query("Node", "", node)
    return is_ready(obj) == ready


async def vmi_phase(vb: Client, name: str, phase: str,
                    namespace: str = "default") -> dict[str, Any] | None:
    items = await vb.query("VirtualMachineInstance", namespace, name)
    return items[0] if items and items[0]["status"]["phase"] == phase else None


async def vm_status(vb: Client, name: str, printable: str,
                    namespace: str = "default") -> dict[str, Any] | None:
    items = await vb.query("VirtualMachine", namespace, name)
    return items[0] if items and items[0]["status"]["printableStatus"] == printable else None


async def replaced(vb: Client, name: str, old_uid: str) -> dict[str, Any] | None:
    """VMI `name` Running again as a new instance (another uid than `old_uid`)."""
    vmi = await vmi_phase(vb, name, "Running")
    return vmi if vmi and vmi["metadata"]["uid"] != old_uid else None


async def vmi_absent(vb: Client, name: str, namespace: str = "default") -> bool:
    return await vb.query("VirtualMachineInstance", namespace, name) == []


async def domains(vb: Client, node: str) -> list[DomainSummary]:
    reply = await vb.nc.request(vb.layout.agent_subject(node, "sim"),
                                msgspec.msgpack.encode(SimRequest(action="domains")), timeout=10)
    answer = msgspec.msgpack.decode(reply.data, type=SimReply)
    assert answer.ok, answer.error
    return answer.domains


async def no_domains(vb: Client, node: str) -> bool:
    return not await domains(vb, node)


async def hosted(vb: Client, uid: str, nodes: int = 2) -> list[DomainSummary]:
    """The domains of VMI `uid` across every node's host: one while it runs, never two."""
    return [d for i in range(1, nodes + 1) for d in await domains(vb, f"node-{i}")
            if d.uid == uid]


def vm_manifest(name: str, run_strategy: str = "Always", memory: str = "64Mi",
                **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "runStrategy": run_strategy,
            "template": {"spec": {"domain": {
                "cpu": {"cores": 1},
                "resources": {"requests": {"memory": memory}},
                "devices": {},
            }, **spec}},
        },
    }

"""R3 rides through the loss of one NATS server of three.

`virtbus up --replicas 3` on a real three-server cluster (control plane, read service and two
node agents, each its own process under up's supervisor). The server killed (`kill -9`) is
made, beforehand, the JetStream meta leader, the leader of every stream and bucket of the
installation and of their durable consumers, and it holds the control plane's connection and
the client's: one kill takes all of it at once, while thirty VMs are being applied.

What must hold: every command gets exactly one outcome (one marker in the log, the same
answer when asked again); every event the client saw accepted is in the log afterwards;
every VM gets a Running VMI; no version twice on any aggregate subject; the control plane
is never restarted and logs no traceback; killed afterwards, it starts again on the
cluster that lacks a server (its set-up reads the streams and writes nothing).

Two control-plane replicas race through a lease handover under load: the leader killed,
or stopped (SIGSTOP) until the standby leads and then resumed, so both write at once.

Each mechanism also has a test of its own, without a failover's timing: set-up on a
degraded cluster writes nothing and lowers nothing; the client retries a read and a
command's publish; the intake works a transient failure again in place; the dispatcher
retries a publish; a follow waits for a log that does not answer yet.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from structlog.testing import capture_logs

from controlplane.defaults import MAX_DELIVER
from controlplane.intake import Consumer
from controlplane.lease import LEASE_KEY
from controlplane.loop import ControlLoop
from controlplane.user.client import Client
from controlplane.writeprotocol import marker_id
from controlplane.writer import Writer
from events.jetstream.connect import connect
from events.jetstream.datastore import TOPIC_HEADER, VERSION_HEADER
from events.jetstream.directget import PAGE, direct_batch, read_all, sequence
from events.jetstream.server import free_port
from events.jetstream.streams import ensure_all
from events.language.codec import Event
from events.language.messages import Command, Outcome
from events.language.subjects import Layout
from projections.follower import follow, read_event
from projections.service import ReadService
from tests.natsserver import Member, cluster, holding, jetstream_ready, lead_from, meta_leader
from tests.store.helpers import register_command
from tests.system.conftest import hco_settled
from tests.system.harness import System, eventually, ready_nodes, vm_manifest

VIRTBUS = Path(sys.executable).parent / "virtbus"
PREFIX = "fo"
VMS = 30
FIRST_WAVE = 10
"""Commands sent before the kill; the other `VMS - FIRST_WAVE` are sent right after it."""
KILL_AFTER = 3
"""Outcomes of the first wave that have arrived when the server is killed."""
SETTLE_SECONDS = 180.0
"""Deadline of a condition that needs the cluster to fail over first (never asserted)."""

pytestmark = pytest.mark.timeout(600)


def small_vm(name: str) -> dict[str, Any]:
    """A VM whose VMI asks for its guest's memory only (`overcommitGuestOverhead`, as
    KubeVirt has it): thirty fit on the two simulated hosts (3Gi each)."""
    manifest = vm_manifest(name)
    manifest["spec"]["template"]["spec"]["domain"]["resources"]["overcommitGuestOverhead"] = True
    return manifest


class Up:
    """`virtbus up` as a person runs it, against the cluster, its output in `up.log`."""

    def __init__(self, url: str, data: Path) -> None:
        self.data = data
        self.log = data / "up.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTBUS_")}
        env["VIRTBUS_CONTEXT"] = str(data / "context.json")
        data.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(VIRTBUS), "up", "--nats-url", url, "--replicas", "3", "--prefix", PREFIX,
                 "--data-dir", str(data / "up"), "--nodes", "2",
                 "--http-port", str(free_port())],
                stdout=out, stderr=subprocess.STDOUT, env=env)

    def restarts(self) -> Counter[str]:
        """How many times up's supervisor restarted each process."""
        counts: Counter[str] = Counter()
        # up is running: its last line may be half written; only whole lines are records.
        for line in self.log.read_text(errors="replace").splitlines(keepends=True):
            if line.startswith("{") and line.endswith("\n") and '"restarting"' in line:
                try:
                    counts[json.loads(line).get("process", "?")] += 1
                except json.JSONDecodeError:
                    continue
        return counts

    def child(self, module: str) -> int:
        """The pid of up's child running `python -m <module>` now."""
        me = self.process.pid
        for pid in Path(f"/proc/{me}/task/{me}/children").read_text().split():
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if argv[1:3] == [b"-m", module.encode()]:
                return int(pid)
        raise LookupError(module)

    def component_log(self, name: str) -> str:
        return (self.data / "up" / "logs" / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Member]]:
    with cluster(tmp_path / "nats", system_account=True) as members:
        yield members


@pytest.fixture
async def url(servers: list[Member]) -> str:
    url = ",".join(s.url for s in servers)
    probe = await Client.connect(url, PREFIX)
    try:
        await jetstream_ready(probe.js)
    finally:
        await probe.close()
    return url


async def installation_streams(vb: Client) -> list[str]:
    """Every stream and bucket (`KV_<bucket>`) of the installation."""
    upper = vb.layout.prefix.upper()
    return sorted(info.config.name for info in await vb.js.streams_info()
                  if info.config.name and (info.config.name.startswith(f"{upper}_")
                                           or info.config.name.startswith(f"KV_{upper}_")))


async def client_on(url: str, server: Member) -> Client:
    """A client whose connection happens to be to `server` (nats-py picks one of the URLs at
    random: connect again until it is), so that killing `server` fails the client over too."""
    for _ in range(60):
        vb = await Client.connect(url, PREFIX, actor="user:alice")
        if vb.nc.connected_url is not None and vb.nc.connected_url.port == server.port:
            return vb
        await vb.close()
    raise AssertionError(f"no client connection landed on {server.name}")


async def until_outcome(vb: Client, command: Command) -> Outcome:
    """`run`: publish and await the one outcome; should `run` give up waiting, the outcome
    is awaited again by its id, as its error says to (a failover may take long)."""
    try:
        return await vb.run(command, check=False)
    except TimeoutError:
        return await vb.outcome(command.id, timeout=SETTLE_SECONDS)


async def all_running(vb: Client, names: list[str]) -> bool:
    vmis = {v["metadata"]["name"]: v["status"]["phase"]
            for v in await vb.query("VirtualMachineInstance", "default")}
    return all(vmis.get(n) == "Running" for n in names)


async def assert_every_outcome_is_one_and_logged(vb: Client, commands: list[Command],
                                                 outcomes: list[Outcome]) -> None:
    """Each command: accepted; one marker in the log; asked again, the same answer; and every
    event it was told of is in the log, caused by it."""
    layout = vb.layout
    for command, outcome in zip(commands, outcomes, strict=True):
        assert outcome.accepted and outcome.sequences, (command.id, outcome)
        markers = await read_all(vb.nc, layout.events_stream,
                                 layout.aggregate_subject(marker_id(command)))
        assert len(markers) == 1, (command.id, [sequence(m) for m in markers])
        assert await vb.outcome(command.id) == outcome
        for seq in outcome.sequences:
            [msg] = await direct_batch(vb.nc, layout.events_stream, seq, 1,
                                       layout.events_filter())
            event = read_event(msg)
            assert sequence(msg) == seq and event is not None, (command.id, seq)
            assert event.causation_id == command.id, (command.id, seq, event)
    again = await vb.run(commands[0], check=False)  # a late retry answers the first outcome
    assert again == outcomes[0]


async def assert_no_version_twice(vb: Client) -> Counter[str]:
    """No aggregate subject of the log holds one version twice, and versions have no gap;
    how many events of each topic the log holds."""
    versions: dict[str, list[int]] = {}
    topics: Counter[str] = Counter()
    position = 1
    while page := await direct_batch(vb.nc, vb.layout.events_stream, position, PAGE,
                                     vb.layout.events_filter()):
        for msg in page:
            headers = msg.headers or {}
            subject = headers.get("Nats-Subject", msg.subject)
            versions.setdefault(subject, []).append(int(headers[VERSION_HEADER]))
            topics[headers.get(TOPIC_HEADER, "")] += 1
        position = sequence(page[-1]) + 1
    assert versions
    for subject, seen in versions.items():
        assert seen == list(range(seen[0], seen[0] + len(seen))), (subject, seen)
    return topics


@pytest.fixture
async def up(url: str, tmp_path: Path) -> AsyncIterator[Up]:
    running = Up(url, tmp_path)
    try:
        yield running
    finally:
        running.stop()


async def test_the_control_plane_rides_through_the_loss_of_the_jetstream_leader(
        servers: list[Member], url: str, up: Up) -> None:
    watcher = await Client.connect(url, PREFIX)
    try:
        await eventually(lambda: ready_nodes(watcher, 2), SETTLE_SECONDS, "two Ready nodes")
        await eventually(lambda: hco_settled(watcher), SETTLE_SECONDS, "the HCO settled")
        streams = await installation_streams(watcher)
        replicas = {name: (await watcher.js.stream_info(name)).config.num_replicas
                    for name in streams}
        assert replicas == dict.fromkeys(streams, 3)  # nothing lowered them
        victim = await asyncio.to_thread(holding, servers, f"{PREFIX}-controlplane")
        assert victim is not None
        await lead_from(servers, victim, watcher.nc, streams)
    finally:
        await watcher.close()

    vb = await client_on(url, victim)
    try:
        names = [f"vm-{i:02d}" for i in range(VMS)]
        commands = [vb.command("VirtualMachine", "apply", manifest=small_vm(n))
                    for n in names]
        tasks = [asyncio.ensure_future(until_outcome(vb, c)) for c in commands[:FIRST_WAVE]]

        async def some_answered() -> bool:
            return sum(t.done() for t in tasks) >= KILL_AFTER

        await eventually(some_answered, SETTLE_SECONDS, "the first outcomes")
        victim.kill()
        tasks += [asyncio.ensure_future(until_outcome(vb, c)) for c in commands[FIRST_WAVE:]]
        outcomes = list(await asyncio.gather(*tasks))

        await assert_every_outcome_is_one_and_logged(vb, commands, outcomes)
        await eventually(lambda: all_running(vb, names), SETTLE_SECONDS,
                         f"{VMS} Running VMIs")
        await assert_no_version_twice(vb)
        restarts = up.restarts()
        print(f"\nfailover: killed {victim.name}; restarts by process: {dict(restarts)}")
        assert restarts["controlplane"] == 0, restarts

        # Killed now, the control plane starts again on the cluster that lacks a server.
        os.kill(up.child("controlplane"), signal.SIGKILL)
        late = vb.command("VirtualMachine", "apply", manifest=small_vm("late"))
        assert (await until_outcome(vb, late)).accepted
        await eventually(lambda: all_running(vb, [*names, "late"]), SETTLE_SECONDS,
                         "the late VM Running")
        assert up.restarts()["controlplane"] == 1  # the kill's, and no other
    finally:
        await vb.close()
    assert "Traceback" not in up.component_log("controlplane")


async def test_set_up_on_a_degraded_cluster_writes_nothing_and_lowers_nothing(
        servers: list[Member], url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ensure_all` on an R3 installation that has lost its meta leader: every stream and
    bucket is read, none is created or updated (an update may not be taken without the
    lost server), whether the caller asks for three replicas or does not know (one)."""
    vb = await Client.connect(url, PREFIX)
    try:
        await ensure_all(vb.js, vb.layout, 3)
        streams = await installation_streams(vb)
        lost = await asyncio.to_thread(meta_leader, servers)
        assert lost is not None
        lost.kill()
        writes: list[str] = []

        def spying(name: str) -> Any:
            call = getattr(vb.js, name)

            def spy(*args: Any, **kwargs: Any) -> Any:
                writes.append(name)
                return call(*args, **kwargs)

            return spy

        for name in ("add_stream", "update_stream", "create_key_value"):
            monkeypatch.setattr(vb.js, name, spying(name))
        await ensure_all(vb.js, vb.layout, 3)
        await ensure_all(vb.js, vb.layout, 1)
        assert writes == []
        replicas = {name: (await vb.js.stream_info(name)).config.num_replicas
                    for name in streams}
        assert replicas == dict.fromkeys(streams, 3)
    finally:
        await vb.close()


async def test_the_client_retries_what_is_transient(nats_url: str, prefix: str) -> None:
    """A read with no read service listening yet (no responders), a command published
    before its stream answers (no stream response): each is retried, one log line per
    attempt, and succeeds once the other side is there; nothing is asked twice of the log
    (the command is in its stream once)."""
    vb = await Client.connect(nats_url, prefix)
    stop = asyncio.Event()
    service: asyncio.Future[None] | None = None
    try:
        with capture_logs() as logs:
            def retried(what: str) -> Callable[[], Awaitable[bool]]:
                async def seen() -> bool:
                    return any(r["event"].startswith(what) for r in logs)
                return seen

            command = vb.command("VirtualMachine", "apply", manifest=small_vm("r"))
            submitted = asyncio.ensure_future(vb.submit(command))
            await eventually(retried("sending a command"), what="the publish retried")
            await ensure_all(vb.js, vb.layout, 1)
            assert await submitted is False  # stored, and once
            read = asyncio.ensure_future(vb.query("VirtualMachine"))
            await eventually(retried("asking the read service"), what="the read retried")
            service = asyncio.ensure_future(ReadService(vb.nc, vb.layout).run(stop))
            assert await read == []
        info = await vb.js.stream_info(vb.layout.commands_stream)
        assert info.state.messages == 1
    finally:
        stop.set()
        if service is not None:
            await service
        await vb.close()


async def test_the_intake_retries_a_transient_failure_in_place(nats_url: str,
                                                               prefix: str) -> None:
    """A message whose work NATS fails `MAX_DELIVER` times in a row (no responders, as
    while a leader is elected) is worked again in place, claimed, and acknowledged once it
    succeeds: not delivered again and again until it is dead-lettered."""
    nc = await connect(nats_url, "test-intake")
    layout = Layout(prefix)
    stop = asyncio.Event()
    running: asyncio.Future[None] | None = None
    deliveries: list[int] = []

    async def work(msg: Msg) -> None:
        deliveries.append(msg.metadata.num_delivered)
        if len(deliveries) <= MAX_DELIVER:
            raise NoRespondersError

    try:
        await ensure_all(nc.jetstream(), layout, 1)
        consumer = Consumer(nc, layout, stream=layout.commands_stream,
                            subject=layout.commands_filter, durable="test", work=work)
        running = asyncio.ensure_future(consumer.run(stop))
        await nc.jetstream().publish(layout.command_subject("user:t", "vm", "apply"), b"x")

        async def acknowledged() -> bool:
            info = await nc.jetstream().consumer_info(layout.commands_stream, "test")
            return len(deliveries) > MAX_DELIVER and info.num_ack_pending == 0

        await eventually(acknowledged, what="the message worked and acknowledged")
        assert deliveries == [1] * (MAX_DELIVER + 1)
        assert consumer.dead_letters == 0
    finally:
        stop.set()
        if running is not None:
            await running
        await nc.close()


async def test_the_dispatcher_retries_a_publish_nats_cannot_take(nats_url: str,
                                                                 prefix: str) -> None:
    """The node stream answers nothing (here: it is not there) when a VMI is scheduled: the
    control loop retries the dispatch, one log line per attempt, and the launch is
    published once the stream answers; the loop never stops."""
    nc = await connect(nats_url, "test-dispatch")
    layout = Layout(prefix)
    js = nc.jetstream()
    stop = asyncio.Event()
    running: asyncio.Future[None] | None = None
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": "web", "namespace": "default"},
           "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}}
    try:
        await ensure_all(js, layout, 1)
        await js.delete_stream(layout.node_stream)
        writer = Writer(nc, layout)
        loop = ControlLoop(nc, layout, writer)
        with capture_logs() as logs:
            running = asyncio.ensure_future(loop.run(stop))
            for command in (register_command("n1"), Command(
                    id=str(uuid.uuid4()), actor="user:erin", kind="VirtualMachineInstance",
                    verb="apply", namespace="default", name="web", manifest=vmi)):
                assert (await writer.execute(command)).outcome.accepted

            async def retried() -> bool:
                return any(r["event"].startswith("dispatching") for r in logs)

            await eventually(retried, what="the dispatch retried")
            await ensure_all(js, layout, 1)  # the node stream answers again

            async def launched() -> bool:
                return (await js.stream_info(layout.node_stream)).state.messages == 1

            await eventually(launched, what="the launch published")
        assert not running.done()  # the loop went on
    finally:
        stop.set()
        if running is not None:
            await running
        await nc.close()


async def test_a_follow_waits_for_a_log_that_does_not_answer_yet(nats_url: str,
                                                                  prefix: str) -> None:
    """A follow (every reader's loop) started while the log answers nothing (here: before
    it exists; a stream electing its leader answers the same) retries its reads, one log
    line per attempt, and delivers the events once the log answers."""
    nc = await connect(nats_url, "test-follow")
    layout = Layout(prefix)
    stop = asyncio.Event()
    seen: list[int] = []

    async def on_event(seq: int, _event: Event) -> None:
        seen.append(seq)

    running: asyncio.Future[None] | None = None
    try:
        with capture_logs() as logs:
            running = asyncio.ensure_future(follow(nc, layout, on_event, stop=stop))

            async def retried() -> bool:
                return any(r["event"].startswith("reading the log's head") for r in logs)

            await eventually(retried, what="the read retried")
            await ensure_all(nc.jetstream(), layout, 1)
            outcome = (await Writer(nc, layout).execute(register_command("n1"))).outcome
            assert outcome.accepted

            async def delivered() -> bool:  # its marker, then its events
                return seen == [outcome.sequences[0] - 1, *outcome.sequences]

            await eventually(delivered, what="the events delivered")
        assert not running.done()
    finally:
        stop.set()
        if running is not None:
            await running
        await nc.close()


async def lease_holder(vb: Client) -> str:
    kv = await vb.js.key_value(vb.layout.leases_bucket)
    return ((await kv.get(LEASE_KEY)).value or b"").decode()


@pytest.mark.parametrize("how", ["kill", "pause"])
async def test_two_control_planes_race_through_a_lease_handover_under_load(
        servers: list[Member], url: str, tmp_path: Path, how: str) -> None:
    """`kill`: the leader is killed (-9) with commands in flight. `pause`: the leader is
    stopped (SIGSTOP) until the standby holds the lease, then resumed: both write at once,
    until the old one finds the lease gone and stops (exit status 1)."""
    # Beats every 2 s over a 3-replica bucket under load: a generous grace, so that one
    # late beat is not a NodeNotReady (which the test asserts there are none of).
    system = System(url, PREFIX, tmp_path, node_grace=20)
    system.args["controlplane"] += ["--replicas", "3"]
    system.add_replica("cp-b")
    process = {"cp-a": "controlplane", "cp-b": "cp-b"}  # lease holder -> process name
    paused = None
    vb = await Client.connect(url, PREFIX, actor="user:alice")
    try:
        await ensure_all(vb.js, vb.layout, 3)  # as `virtbus up` does before its children
        system.start_all()
        try:
            await eventually(lambda: ready_nodes(vb, 2), SETTLE_SECONDS, "two Ready nodes")
            await eventually(lambda: hco_settled(vb), SETTLE_SECONDS, "the HCO settled")
            leader = await lease_holder(vb)
            names = [f"vm-{i:02d}" for i in range(VMS)]
            commands = [vb.command("VirtualMachine", "apply", manifest=small_vm(n))
                        for n in names]
            tasks = [asyncio.ensure_future(until_outcome(vb, c))
                     for c in commands[:FIRST_WAVE]]

            async def some_answered() -> bool:
                return sum(t.done() for t in tasks) >= KILL_AFTER

            await eventually(some_answered, SETTLE_SECONDS, "the first outcomes")
            if how == "kill":
                system.kill(process[leader])
            else:
                paused = system.procs[process[leader]]
                paused.send_signal(signal.SIGSTOP)
            tasks += [asyncio.ensure_future(until_outcome(vb, c))
                      for c in commands[FIRST_WAVE:]]

            async def handed_over() -> bool:
                return await lease_holder(vb) not in ("", leader)

            await eventually(handed_over, SETTLE_SECONDS, "the standby leading")
            if paused is not None:
                paused.send_signal(signal.SIGCONT)  # two leaders, until the old one sees
            outcomes = list(await asyncio.gather(*tasks))
            await assert_every_outcome_is_one_and_logged(vb, commands, outcomes)
            await eventually(lambda: all_running(vb, names), SETTLE_SECONDS,
                             f"{VMS} Running VMIs")
            topics = await assert_no_version_twice(vb)
            # Nodes heartbeated all along: a leader that was not running meanwhile does not
            # judge them by its stale view of their heartbeats when it resumes.
            assert topics["NodeNotReady.v1"] == 0, topics
            if paused is not None:
                await eventually(lambda: asyncio.sleep(0, paused.poll() is not None),
                                 SETTLE_SECONDS, "the old leader stopping")
                assert paused.returncode == 1  # the lease lost, not a crash
            assert await lease_holder(vb) not in ("", leader)
        finally:
            if paused is not None and paused.poll() is None:
                paused.send_signal(signal.SIGCONT)
            system.stop_all()
    finally:
        await vb.close()

"""Chaos: `kill -9` of the control plane, then of node agents, at random moments under a
steady load of commands, with `virtbus up` itself running everything (its supervisor restarts
whatever dies).

Three clients send 150 commands in all (apply with runStrategy Always or Halted, start, stop,
restart) to six VMs, each with a known id, awaiting its outcome; an await that times out
during a kill submits the same command again (harmless: the stream dedupes it) and awaits it
again by id. Now and then a client also sends an earlier command again as a late retry (a
new stream message, as after the command stream's duplicate window). Meanwhile the control
plane (3 times) or a random node agent (2 times) is killed at a random moment. Once the
system has settled, what must hold:

- every command has exactly one outcome, the one first seen: awaited again by id, and as
  answered to every late retry; the log holds exactly one marker per command id (of every
  command, the controllers' and the nodes' too), accepted with the outcome's sequences right
  after it, or rejected with its reason;
- no event is in the log twice: no event id and no (aggregate, version) repeats, and each
  aggregate's versions run 1..n, in log order, without gaps;
- no domain is defined twice (see `definitions`), no VMI uid is launched by two work items,
  and the hosts hold exactly one domain per Running VMI and no other;
- a VM whose final runStrategy is Always has a Running VMI; a Halted VM has none.

Time is compressed: the events stream's duplicate window (10 minutes) is cut to a second
(again after each control-plane restart, which sets it back), so every redelivery and retry
in the test comes as late as one after the window would: a command is answered by its
marker, not by the window.

Everything random (what each client sends, its pauses, when and what is killed) comes from
one seed, printed first; `VIRTBUS_CHAOS_SEED=<seed>` runs that schedule again (how it
interleaves with the processes' own timing may still differ).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.msg import Msg

from controlplane.user.client import Client
from controlplane.writeprotocol import marker_id
from events.api.kinds import token_of
from events.jetstream.directget import read_all, sequence
from events.language.codec import event_id
from events.language.messages import (
    COMMAND_KIND,
    Command,
    CommandAccepted,
    CommandRejected,
    Outcome,
    outcome_key,
)
from nodeagent.worklog import AppliedWork
from projections.follower import read_event
from tests.system.conftest import hco_settled
from tests.system.harness import domains, eventually, last_sequence, ready_nodes, vm_manifest

SEED_ENV = "VIRTBUS_CHAOS_SEED"
NODES = ("node-1", "node-2")
NODE_GRACE_SECONDS = 3.0
"""As the other system tests: an agent silent this long makes its node NotReady."""
VMS = tuple(f"chaos-{i}" for i in range(6))
CLIENTS = 3
COMMANDS_PER_CLIENT = 50
"""150 commands in all, each client's first two creating its own two VMs."""
OPERATIONS = (("apply", "Always"), ("apply", "Halted"), ("start", ""), ("stop", ""),
              ("restart", ""))
WEIGHTS = (1, 1, 2, 2, 2)
PACING_SECONDS = (0.05, 0.4)
"""A client's pause after each command: load shaping, not a wait for anything."""
KILL_GAP_SECONDS = (1.0, 3.0)
"""The pause before each kill: load shaping, it decides when the kill lands..."""
CONTROL_PLANE_AIM_SECONDS = (0.0, 0.015)
"""... and then, once a client has submitted its next command, this pause: the control
plane dies while that command (and whatever else is in flight) is being decided, often
between its append and its acknowledgement, the moment that makes it be delivered again..."""
AGENT_AIM_SECONDS = (0.0, 0.006)
"""... or, once the agent has taken up its next work item, this one: it dies doing it."""
AIM_WAIT_SECONDS = 2.0
AIM_POLL_SECONDS = 0.001
WORK_TAKEN = '"event": "node command"'
"""What the agent logs as it takes up a work item (`nodeagent.consumer.WorkConsumer._apply`)."""
LATE_RETRY_SHARE = 0.1
"""Of a client's commands, the share followed by a late retry of one of its earlier ones."""
CONTROL_PLANE_KILLS = 3
AGENT_KILLS = 2
OUTCOME_WAIT_SECONDS = 1.0
"""One await of an outcome; then the command is submitted again and awaited again."""
COMMAND_DEADLINE_SECONDS = 90.0
SETTLE_SECONDS = 90.0
DEDUPE_WINDOW_SECONDS = 1.0
STARTED = "domain started"
"""What `nodeagent.lifecycle.define_and_start` logs each time it defines and starts a domain
(with the domain's uuid: the VMI uid, as no manifest here sets `firmware.uuid`)."""



# -- `virtbus up` and its children -------------------------------------------------------------


class Up:
    """`virtbus up` on the session's nats-server, in its own process group, with its data
    directory (logs in `logs/`, simulated hosts in `hosts/`) under `root`."""

    def __init__(self, nats_url: str, prefix: str, root: Path) -> None:
        self.nats_url = nats_url
        data = root / "data"
        data.mkdir(parents=True)
        self.logs = data / "logs"
        self.cuts: dict[str, list[int]] = defaultdict(list)
        """Per child, its log's size at each kill: where each later process's lines begin."""
        env = {**os.environ, "VIRTBUS_CONTEXT": str(root / "context.json")}
        with (root / "up.log").open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "controlplane.user.cli", "up", "--nats-url", nats_url,
                 "--prefix", prefix, "--data-dir", str(data), "--nodes", str(len(NODES)),
                 "--node-grace", str(NODE_GRACE_SECONDS)],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def child(self, name: str) -> int | None:
        """The pid of `up`'s live child `name` (`controlplane`, `projections`, `node-1`...)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().decode().split("\0")
            except (OSError, UnicodeDecodeError):
                continue  # gone meanwhile
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if int(ppid) == self.proc.pid and state != "Z" and _child_name(cmdline) == name:
                return int(entry.name)
        return None

    def pid(self, name: str) -> int:
        pid = self.child(name)
        assert pid is not None, f"`virtbus up` runs no {name}"
        return pid

    async def kill(self, name: str, pid: int) -> None:
        """`kill -9` the child `name` (process `pid`); back once it is dead (up restarts it)."""
        os.kill(pid, signal.SIGKILL)

        async def dead() -> bool:
            return _dead(pid)

        await eventually(dead, what=f"{name} ({pid}) dead")
        self.cuts[name].append((self.logs / f"{name}.log").stat().st_size)

    async def restarted(self, name: str, old: int) -> None:
        async def new_process() -> bool:
            return self.child(name) not in (None, old)

        await eventually(new_process, what=f"{name} restarted by `virtbus up`")

    def stop(self) -> None:
        """As Ctrl-C does; whatever is left of the group after that is killed."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):  # the whole group is gone already
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _child_name(cmdline: list[str]) -> str:
    """`python -m controlplane run ...` is `controlplane`; an agent is its `--node`."""
    if len(cmdline) < 3 or cmdline[1] != "-m":
        return ""
    if cmdline[2] == "nodeagent" and "--node" in cmdline[:-1]:
        return cmdline[cmdline.index("--node") + 1]
    return cmdline[2]


def _dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # reaped
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.fixture
def up(nats_url: str, prefix: str, tmp_path: Path) -> Iterator[Up]:
    running = Up(nats_url, prefix, tmp_path)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
async def client(up: Up, nats_url: str, prefix: str) -> AsyncIterator[Client]:
    vb = await Client.connect(nats_url, prefix, actor="user:chaos-checker")
    try:
        await eventually(lambda: ready_nodes(vb, len(NODES)), what="two Ready nodes")
        await eventually(lambda: hco_settled(vb), what="the HyperConverged settled")
        yield vb
    finally:
        await vb.close()


# -- the load ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Sent:
    command: Command
    outcome: Outcome
    """The first outcome the client got."""
    answers: list[Outcome] = dataclasses.field(default_factory=list)
    """What each late retry of the command was answered."""


@dataclasses.dataclass
class Load:
    sent: dict[str, Sent] = dataclasses.field(default_factory=dict)
    reawaits: int = 0
    late_retries: int = 0
    submitted: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set at each submit: a kill aimed at a command in flight waits for it."""


async def decided(vb: Client, command: Command, load: Load) -> Outcome:
    """Submit `command` and await its outcome; after each await that times out, submit the
    same command again and await it again by its id."""
    await vb.submit(command)
    load.submitted.set()
    deadline = time.monotonic() + COMMAND_DEADLINE_SECONDS
    while True:
        try:
            return await vb.outcome(command.id, timeout=OUTCOME_WAIT_SECONDS)
        except TimeoutError:
            if time.monotonic() > deadline:
                raise AssertionError(f"no outcome for {command.verb} {command.name} "
                                     f"({command.id})") from None
            load.reawaits += 1
            await vb.submit(command)


async def late_retry(vb: Client, command: Command, load: Load) -> Outcome:
    """`command` published again as a new message of the command stream (as a retry after
    its duplicate window would be), so the control plane handles it again; what it answers
    (the outcome it puts again)."""
    load.late_retries += 1
    arrival: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
    sub = await vb.nc.subscribe(f"$KV.{vb.layout.outcomes_bucket}."
                                f"{outcome_key(command.actor, command.id)}",
                                future=arrival, max_msgs=1)
    try:
        subject = vb.layout.command_subject(
            command.actor, token_of(command.kind), command.verb)
        await vb.js.publish(subject, msgspec.msgpack.encode(command),
                            headers={"Nats-Msg-Id": f"{command.id}:late:{load.late_retries}"})
        try:
            msg = await asyncio.wait_for(arrival, COMMAND_DEADLINE_SECONDS)
        except TimeoutError:
            raise AssertionError(f"a late retry of {command.id} was not answered") from None
    finally:
        await sub.unsubscribe()
    return msgspec.msgpack.decode(msg.data, type=Outcome)


def random_command(vb: Client, rng: random.Random) -> Command:
    (verb, strategy), = rng.choices(OPERATIONS, WEIGHTS)
    name = rng.choice(VMS)
    if verb == "apply":
        return vb.command("VirtualMachine", "apply", manifest=vm_manifest(name, strategy))
    return vb.command("VirtualMachine", verb, "default", name)


async def one_client(vb: Client, rng: random.Random, own: list[str], load: Load) -> None:
    mine: list[Sent] = []
    for n in range(COMMANDS_PER_CLIENT):
        if n < len(own):
            strategy = rng.choice(("Always", "Halted"))
            command = vb.command("VirtualMachine", "apply", manifest=vm_manifest(own[n], strategy))
        else:
            command = random_command(vb, rng)
        sent = Sent(command, await decided(vb, command, load))
        load.sent[command.id] = sent
        mine.append(sent)
        if rng.random() < LATE_RETRY_SHARE:
            earlier = rng.choice(mine)
            earlier.answers.append(await late_retry(vb, earlier.command, load))
        await asyncio.sleep(rng.uniform(*PACING_SECONDS))  # load shaping


async def shorten_dedupe_window(vb: Client) -> None:
    info = await vb.js.stream_info(vb.layout.events_stream)
    await vb.js.update_stream(dataclasses.replace(info.config,
                                                  duplicate_window=DEDUPE_WINDOW_SECONDS))


async def dedupe_window_reset(vb: Client) -> bool:
    """The control plane (re)started has set the events stream's configuration again."""
    info = await vb.js.stream_info(vb.layout.events_stream)
    return (info.config.duplicate_window or 0) > DEDUPE_WINDOW_SECONDS


Aim = Callable[[Up, Load, str, random.Random], Awaitable[None]]
"""Waits for the moment to kill the child named."""


async def in_a_decision(_up: Up, load: Load, _name: str, rng: random.Random) -> None:
    """Just after a client's next submit (at once if none comes: the load is over), and a
    pause of `CONTROL_PLANE_AIM_SECONDS`."""
    load.submitted.clear()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(load.submitted.wait(), AIM_WAIT_SECONDS)
    await asyncio.sleep(rng.uniform(*CONTROL_PLANE_AIM_SECONDS))  # load shaping


async def in_node_work(up: Up, _load: Load, node: str, rng: random.Random) -> None:
    """Just after `node`'s agent logs that it takes up its next work item (at once if none
    comes), and a pause of `AGENT_AIM_SECONDS`."""
    log = up.logs / f"{node}.log"
    seen = log.stat().st_size
    deadline = time.monotonic() + AIM_WAIT_SECONDS
    while time.monotonic() < deadline:
        with log.open("rb") as lines:
            lines.seek(seen)
            if WORK_TAKEN.encode() in lines.read():
                break
        await asyncio.sleep(AIM_POLL_SECONDS)  # poll interval of a condition wait
    await asyncio.sleep(rng.uniform(*AGENT_AIM_SECONDS))  # load shaping


async def kill_at_random(up: Up, vb: Client, load: Load, rng: random.Random, *, kills: int,
                         victim: Callable[[], str], aim: Aim) -> list[str]:
    """`kills` times: a random pause, `kill -9` of `victim()` at a moment `aim` picks, and
    its restart by `up`."""
    killed: list[str] = []
    for _ in range(kills):
        await asyncio.sleep(rng.uniform(*KILL_GAP_SECONDS))  # load shaping: when it lands
        name = victim()
        pid = up.pid(name)  # looked up first: the aim is a matter of milliseconds
        await aim(up, load, name, rng)
        await up.kill(name, pid)
        killed.append(name)
        await up.restarted(name, pid)
        if name == "controlplane":
            await eventually(lambda: dedupe_window_reset(vb), what="the streams ensured again")
            await shorten_dedupe_window(vb)
    return killed


async def under_chaos(up: Up, vb: Client, seed: int, *, kills: int,
                      victim: Callable[[random.Random], str], aim: Aim) -> tuple[Load, list[str]]:
    """The whole load from `CLIENTS` clients, while `kills` victims are killed; what was
    sent and what was killed."""
    print(f"chaos seed {seed} ({SEED_ENV}={seed} replays it)")
    await shorten_dedupe_window(vb)
    load = Load()
    clients = [await Client.connect(up.nats_url, vb.layout.prefix, actor=f"user:chaos-{i}")
               for i in range(CLIENTS)]
    chaos = random.Random(f"{seed}:chaos")
    try:
        async with asyncio.TaskGroup() as group:
            for i, c in enumerate(clients):
                own = list(VMS[2 * i:2 * i + 2])
                group.create_task(one_client(c, random.Random(f"{seed}:client:{i}"), own, load))
            killing = group.create_task(kill_at_random(
                up, vb, load, chaos, kills=kills, victim=lambda: victim(chaos), aim=aim))
    finally:
        for c in clients:
            await c.close()
    return load, killing.result()


def chaos_seed() -> int:
    given = os.environ.get(SEED_ENV)
    return int(given) if given else random.SystemRandom().randrange(2**32)


# -- settling -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Snapshot:
    vms: dict[str, dict[str, Any]]
    """By name, as the read service renders them."""
    vmis: dict[str, dict[str, Any]]
    hosted: dict[str, list[str]]
    """Per node, the VMI uids of its host's domains."""
    running: list[str]
    """The uids of the Running VMIs, sorted."""
    problems: list[str]
    """What differs from a settled system; nothing once it has settled."""


async def snapshot(vb: Client) -> Snapshot:
    """VMs and VMIs as of the log's head, and each host's domains."""
    head = await last_sequence(vb)
    vms = {v["metadata"]["name"]: v for v in await vb.query("VirtualMachine", after=head)}
    vmis = {v["metadata"]["name"]: v
            for v in await vb.query("VirtualMachineInstance", after=head)}
    hosted = {node: [d.uid for d in await domains(vb, node)] for node in NODES}
    ready = await ready_nodes(vb, len(NODES))
    problems: list[str] = [] if ready else ["not every node is Ready"]
    for name, vm in sorted(vms.items()):
        strategy = vm["spec"]["runStrategy"]
        vmi = vmis.get(name)
        phase = "absent" if vmi is None else vmi["status"]["phase"]
        going = vmi is not None and "deletionTimestamp" in vmi["metadata"]
        if strategy == "Always" and (phase != "Running" or going):
            problems.append(f"{name} is Always, its VMI {phase}{' (going)' * going}")
        elif strategy == "Halted" and vmi is not None:
            problems.append(f"{name} is Halted, its VMI {phase}")
    running = sorted(v["metadata"]["uid"] for v in vmis.values()
                     if v["status"]["phase"] == "Running")
    on_hosts = sorted(uid for uids in hosted.values() for uid in uids)
    if on_hosts != running:
        problems.append(f"domains {hosted} are not one per Running VMI {running}")
    if await last_sequence(vb) != head:
        problems.append("the log moved on")
    return Snapshot(vms, vmis, hosted, running, problems)


async def settled(vb: Client) -> Snapshot:
    last: list[str] = ["nothing read yet"]

    async def probe() -> Snapshot | None:
        found = await snapshot(vb)
        last[:] = found.problems
        return None if last else found

    try:
        return await eventually(probe, SETTLE_SECONDS, "the system to settle")
    except AssertionError as e:
        raise AssertionError(f"{e}: {'; '.join(last)}") from None


# -- what must hold -----------------------------------------------------------------------------


async def outcome_problems(vb: Client, load: Load) -> list[str]:
    """Each command's outcome, awaited again, and what its late retries were answered, are
    its first; its one marker in the log says the same."""
    problems: list[str] = []
    for cid, sent in load.sent.items():
        first = sent.outcome
        again = await vb.outcome(cid, timeout=OUTCOME_WAIT_SECONDS)
        if again != first:
            problems.append(f"{cid}: first {first}, now {again}")
        problems += [f"{cid}: first {first}, a late retry {a}" for a in sent.answers
                     if a != first]
        markers = await read_all(vb.nc, vb.layout.events_stream,
                                 vb.layout.aggregate_subject(marker_id(sent.command)))
        if len(markers) != 1:
            problems.append(f"{cid}: {len(markers)} markers")
            continue
        marker = read_event(markers[0])
        after = sequence(markers[0]) + 1
        match marker:
            case CommandAccepted(event_count=count, sequences=alone) if first.accepted:
                if first.sequences != (alone or list(range(after, after + count))):
                    problems.append(f"{cid}: sequences {first.sequences}, marker at {after - 1} "
                                    f"with {count} events")
            case CommandRejected(reason=reason) if not first.accepted:
                if reason != first.reason:
                    problems.append(f"{cid}: refused for {first.reason!r}, marker {reason!r}")
            case _:
                problems.append(f"{cid}: outcome {first}, marker {marker}")
    return problems


async def log_problems(vb: Client) -> tuple[int, list[str]]:
    """The whole log: every event decodes, none is in it twice (event id, aggregate version),
    each aggregate's versions are 1..n in log order, each command has one marker."""
    msgs = await read_all(vb.nc, vb.layout.events_stream, vb.layout.events_filter())
    problems: list[str] = []
    ids: Counter[str] = Counter()
    positions: Counter[tuple[str, int]] = Counter()
    versions: dict[str, int] = {}
    for msg in msgs:
        seq = sequence(msg)
        event = read_event(msg)
        if event is None:
            problems.append(f"{seq}: not an event this version reads")
            continue
        agg, version = event.originator_id, event.originator_version
        stored_id = (msg.headers or {}).get("Nats-Msg-Id", "")
        if stored_id != str(event_id(agg, version)):
            problems.append(f"{seq}: stored id {stored_id!r} is not {agg} v{version}'s")
        ids[stored_id] += 1
        positions[(agg, version)] += 1
        if version != versions.get(agg, 0) + 1:
            problems.append(f"{seq}: {agg} v{version} after v{versions.get(agg, 0)}")
        versions[agg] = max(version, versions.get(agg, 0))
    problems += [f"event id {i} {n} times" for i, n in ids.items() if n > 1]
    problems += [f"{agg} v{v} {n} times" for (agg, v), n in positions.items() if n > 1]
    problems += [f"{agg} has {n} markers" for agg, n in versions.items()
                 if agg.startswith(f"{COMMAND_KIND}.") and n != 1]
    return len(msgs), problems


def definitions(logs: Path, cuts: dict[str, list[int]]) -> list[tuple[str, str, int]]:
    """Every domain definition on the simulated hosts: (VMI uid, node, agent process).

    libvirt's test driver keeps no count, so the agents' logs give it: each `STARTED` line is
    one `defineXML` and start. An agent's log holds the lines of each of its processes in
    turn; `cuts` (the log's size at each kill) tell which process (0, 1, ...) wrote a line.
    """
    found: list[tuple[str, str, int]] = []
    for node in NODES:
        offset = 0
        for line in (logs / f"{node}.log").read_bytes().splitlines(keepends=True):
            start, offset = offset, offset + len(line)
            if STARTED.encode() not in line:
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line torn by a kill: not written by the agent's logger whole
            if entry.get("event") == STARTED:
                found.append((entry["uuid"], node, bisect.bisect_right(cuts[node], start)))
    return found


def definition_problems(defined: list[tuple[str, str, int]], running: list[str],
                        agents_killed: bool) -> list[str]:
    """Without agent kills, each VMI uid is defined at most once. With them, at most once by
    each agent process, and on one node only: a definition that the killed agent had not
    yet saved to its simulated host died with it (the host file is the host, see
    `nodeagent.hostfile`), so its redelivered launch defines it again, once."""
    problems = [f"Running VMI {uid} was never defined" for uid in running
                if uid not in {d[0] for d in defined}]
    per_uid: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for uid, node, process in defined:
        per_uid[uid].append((node, process))
    for uid, where in per_uid.items():
        if not agents_killed and len(where) > 1:
            problems.append(f"VMI {uid} defined {len(where)} times: {where}")
        elif len({node for node, _ in where}) > 1 or len(set(where)) < len(where):
            problems.append(f"VMI {uid} defined on {where}")
    return problems


async def launch_problems(vb: Client) -> list[str]:
    """The agents' records of work applied: one launch work item (one event) per VMI uid."""
    bucket = vb.layout.applied_bucket
    kv = await vb.js.key_value(bucket)
    info = await vb.js.stream_info(f"KV_{bucket}", subjects_filter=f"$KV.{bucket}.*.work.*")
    launches: dict[str, list[str]] = defaultdict(list)
    for subject in info.state.subjects or {}:
        key = subject.removeprefix(f"$KV.{bucket}.")
        entry = await kv.get(key)
        work = msgspec.msgpack.decode(entry.value or b"", type=AppliedWork)
        if work.verb == "launch":
            launches[work.uid].append(key)
    if not launches:
        return ["no launch applied on any node"]
    return [f"VMI {uid} launched by {keys}" for uid, keys in launches.items() if len(keys) > 1]


async def check(vb: Client, up: Up, load: Load, killed: list[str]) -> None:
    """Everything that must hold, each kind of problem reported (the first few of each)."""
    found: dict[str, list[str]] = {}
    try:
        state = await settled(vb)
    except AssertionError as e:
        found["settled"] = [str(e)]
        state = await snapshot(vb)
    vms, vmis, running = state.vms, state.vmis, state.running
    found["run strategies"] = [f"{len(vms)} VMs, not {len(VMS)}"] if len(vms) != len(VMS) else []
    for name, vm in sorted(vms.items()):
        vmi = vmis.get(name)
        if vm["spec"]["runStrategy"] == "Always" and (vmi is None or
                                                       vmi["status"]["phase"] != "Running"):
            found["run strategies"].append(f"{name} is Always without a Running VMI: {vmi}")
        if vm["spec"]["runStrategy"] == "Halted" and vmi is not None:
            found["run strategies"].append(f"{name} is Halted with a VMI: {vmi}")
    hosted = sorted(uid for uids in state.hosted.values() for uid in uids)
    found["domains"] = [] if hosted == running else [
        f"domains {state.hosted}, Running VMIs {running}"]
    found["outcomes"] = await outcome_problems(vb, load)
    events, found["log"] = await log_problems(vb)
    defined = definitions(up.logs, up.cuts)
    found["definitions"] = definition_problems(defined, running, any(k in NODES for k in killed))
    found["launches"] = await launch_problems(vb)

    accepted = sum(s.outcome.accepted for s in load.sent.values())
    print(f"killed {killed}; {len(load.sent)} commands ({accepted} accepted), "
          f"{load.reawaits} awaited again, {load.late_retries} late retries; {events} events; "
          f"{len({d[0] for d in defined})} VMIs defined, {len(defined)} definitions; "
          f"{len(running)} Running at the end")
    failed = {kind: problems for kind, problems in found.items() if problems}
    assert not failed, "\n".join(f"{kind} ({len(problems)}):\n  " + "\n  ".join(problems[:8])
                                  for kind, problems in failed.items())


# -- the tests ----------------------------------------------------------------------------------


async def test_kill_9_of_the_control_plane_under_load(up: Up, client: Client) -> None:
    load, killed = await under_chaos(up, client, chaos_seed(), kills=CONTROL_PLANE_KILLS,
                                     victim=lambda _rng: "controlplane", aim=in_a_decision)
    await check(client, up, load, killed)


async def test_kill_9_of_node_agents_under_load(up: Up, client: Client) -> None:
    load, killed = await under_chaos(up, client, chaos_seed(), kills=AGENT_KILLS,
                                     victim=lambda rng: rng.choice(NODES), aim=in_node_work)
    await check(client, up, load, killed)


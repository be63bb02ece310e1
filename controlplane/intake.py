"""Intake: commands from clients and reports from node agents, each from a durable consumer.

Every message is its own task (up to `INTAKE_CONCURRENCY` at once, claimed while worked on),
isolated from the others:

| the message                                  | then                                        |
|----------------------------------------------|---------------------------------------------|
| decides (accepted, no-op or refused)         | outcome recorded in the log, published to   |
|                                              | the outcomes bucket, acknowledged           |
| does not decode, or has no usable id         | dead-lettered, terminated                   |
| NATS failed it for a moment (a server lost,  | worked again in place, still claimed, after |
| a leader being elected: `is_transient`)      | a pause (one log line), until it succeeds   |
| the log could not be read or written         | redelivered after a pause; on its           |
|                                              | `MAX_DELIVER`th delivery, dead-lettered     |

A pull the server cannot serve (no consumer leader: 503; a leadership change: 409) is asked
again after a pause, the consumer set up again first, never in a spin.

Dead letters go to `<p>.dead.<stream>` (stream `<P>_DEADLETTERS`) with the original subject,
sequence and the reason in headers: inspectable, counted (`virtbus_dead_letters_total`), and
logged. Commands for one object keep their arrival order (the writer's turns); a command
delivered again answers its first outcome from its marker.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig

from controlplane.announcer import Announcer
from controlplane.decision import INTERNAL_VERBS, Verdict
from controlplane.defaults import (
    INTAKE_CONCURRENCY,
    INTAKE_RETRY_SECONDS,
    MAX_DELIVER,
    PULL_EXPIRES_SECONDS,
    PULL_TOP_UP,
)
from controlplane.writer import Writer
from events.api.names import SYSTEM_ACTOR_PREFIX
from events.authorization.policy import Policy, command_request
from events.jetstream.transient import retry_until_stopped, retry_while_running
from events.language.ids import name_uuid
from events.language.messages import (
    MAX_ID_LENGTH,
    Command,
    NodeReport,
    Outcome,
    message_decoder,
    node_actor,
    outcome_key,
)
from events.language.subjects import Layout
from events.runtime.aio import ACK_WAIT_SECONDS, claimed, pause_unless_stopped, unless_stopped

log = structlog.get_logger(__name__)

COMMANDS_CONSUMER = "controlplane-commands"
REPORTS_CONSUMER = "controlplane-reports"
_REPORT_IDS = uuid.UUID("5b0e1c77-3f41-5d2e-8a6b-1c9d0e7f2a34")

_decode_command = message_decoder(Command)
_decode_report = message_decoder(NodeReport)
_encode_json = msgspec.json.Encoder().encode
ACK_PREFIX = "$JS.ACK."
"""How the reply subject of every JetStream delivery starts."""


class DeadLetter(Exception):
    """This message can never be handled: say why, park it, and go on."""


class Consumer:
    """One durable pull consumer worked by many tasks at once, each message isolated."""

    def __init__(self, nc: Client, layout: Layout, *, stream: str, subject: str,
                 durable: str, work: Callable[[Msg], Awaitable[None]]) -> None:
        self.nc = nc
        self.layout = layout
        self.stream = stream
        self.subject = subject
        self.durable = durable
        self.work = work
        self.dead_letters = 0
        self._asked = 0
        """Messages asked for with pull requests and not yet delivered."""
        self._running: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._heard = 0.0
        """When the server last sent anything on the pulls' inbox (the loop's clock)."""
        self._unanswered = ""
        """Why the server could not serve the last pull (no consumer leader, a leadership
        change): the next ask waits a little, and makes sure the consumer is there."""

    async def run(self, stop: asyncio.Event) -> None:
        """Keep pull requests outstanding for as many messages as there are free places,
        and start each message's task the moment it arrives (nats-py's `fetch` waits for
        the whole batch or its timeout, which held arrived commands back for a second)."""
        config = ConsumerConfig(durable_name=self.durable, ack_policy=AckPolicy.EXPLICIT,
                                ack_wait=ACK_WAIT_SECONDS, max_deliver=MAX_DELIVER,
                                max_ack_pending=INTAKE_CONCURRENCY * 4,
                                filter_subject=self.subject)
        self._stop = stop

        async def ensure_consumer() -> bool:  # or brings it up to date
            return await retry_until_stopped(
                lambda: self.nc.jetstream().add_consumer(self.stream, config),
                "setting up the intake's consumer", stop, stream=self.stream) is not None

        if not await ensure_consumer():
            return
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox, cb=self._arrived)
        pull = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.durable}"
        try:
            while not stop.is_set():
                self._wake.clear()  # first: a wake while a pull is being sent is kept
                if self._unanswered:  # a cluster electing leaders: do not ask in a spin
                    log.warning("intake's pull went unanswered; asking again",
                                stream=self.stream, reason=self._unanswered)
                    self._unanswered = ""
                    await pause_unless_stopped(stop, INTAKE_RETRY_SECONDS)
                    if not await ensure_consumer():
                        break
                    continue
                want = self._wanted()
                if want:
                    request = {"batch": want, "expires": int(PULL_EXPIRES_SECONDS * 1e9)}
                    self._asked += want  # before the await: what arrives meanwhile counts
                    try:
                        await self.nc.publish(pull, _encode_json(request), reply=inbox)
                    except NatsError as e:
                        self._asked = max(0, self._asked - want)
                        log.warning("intake could not ask for work; retrying",
                                    stream=self.stream, error=str(e) or type(e).__name__)
                        await pause_unless_stopped(stop, INTAKE_RETRY_SECONDS)
                        continue
                woke = await _first(self._wake.wait(), stop.wait(),
                                    timeout=PULL_EXPIRES_SECONDS + 1)
                silent = asyncio.get_running_loop().time() - self._heard
                if not woke and silent > PULL_EXPIRES_SECONDS:
                    self._asked = 0  # no word from the server for a whole pull: ask afresh
        finally:
            try:
                await sub.unsubscribe()
            except NatsError as e:  # the connection closed or lost: no interest left anyway
                log.debug("intake's inbox not unsubscribed", stream=self.stream,
                          error=str(e) or type(e).__name__)
            await asyncio.gather(*self._running, return_exceptions=True)

    async def _arrived(self, msg: Msg) -> None:
        """A delivery (it carries the reply its ack goes to), or the server's word that a
        pull ended (expired, or cut short: a status, with no reply). A delivery keeps the
        headers its publisher set, `Status` too: it is worked like any other."""
        self._heard = asyncio.get_running_loop().time()
        if not msg.reply.startswith(ACK_PREFIX):
            if msg.reply or not msg.headers or "Status" not in msg.headers:
                log.warning("intake's inbox: neither a delivery nor a pull's status; ignored",
                            stream=self.stream, subject=msg.subject, reply=msg.reply[:200])
                return
            self._pull_ended(msg.headers)
        else:
            self._asked = max(0, self._asked - 1)
            task = asyncio.ensure_future(self._one(msg))
            self._running.add(task)
            task.add_done_callback(self._finished)
            self._wake_if_wanted()

    def _pull_ended(self, headers: dict[str, str]) -> None:
        """What the pull left undelivered is no longer asked for (all of it, if the status
        does not say)."""
        pending = headers.get("Nats-Pending-Messages", "")
        self._asked = max(0, self._asked - int(pending)) if pending.isdigit() else 0
        if headers["Status"] in ("503", "409"):  # no responders; a leadership change
            why = headers.get("Description", "").split("\n")[0]  # nats-py runs on
            self._unanswered = f"{headers['Status']} {why}".strip()
        self._wake.set()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._wake_if_wanted()

    def _wanted(self) -> int:
        """How many messages to ask for now: enough free places for a pull worth asking,
        or any when nothing is asked."""
        want = INTAKE_CONCURRENCY - len(self._running) - self._asked
        return want if want >= PULL_TOP_UP or (want > 0 and self._asked == 0) else 0

    def _wake_if_wanted(self) -> None:
        """Wake the asking loop only when it has a pull to send: not once per message (two
        tasks and a wait each time, 2 % of the control plane's time)."""
        if self._wanted():
            self._wake.set()

    async def _one(self, msg: Msg) -> None:
        """The work's outcome decides the message's fate, never its claim or its ack: work
        done is acknowledged, and an ack NATS cannot take only brings the message back, to be
        answered from its marker (a claim not renewed does the same, `claimed`). The claim is
        kept until that fate is settled, a dead letter's storing included."""
        async with claimed(msg):
            try:
                await self._work_through(msg)
            except DeadLetter as e:
                await self._dead_letter(msg, str(e))
                return
            except Exception as e:  # the log or the connection failed this time: again later
                delivered = msg.metadata.num_delivered
                if delivered >= MAX_DELIVER:
                    await self._dead_letter(msg, f"failed {delivered} times, last: {e!r}")
                    return
                log.warning("intake message failed; it will be delivered again",
                            subject=msg.subject, delivered=delivered, error=repr(e))
                await _quietly(msg.nak(delay=INTAKE_RETRY_SECONDS))
                return
        await _quietly(msg.ack())

    async def _work_through(self, msg: Msg) -> None:
        """The message's work, tried again in place, claim kept, while NATS fails it for a
        moment (a server lost, a leader being elected): a command is not dead-lettered for
        the cluster's trouble. Its first outcome stays final: a retried command that was
        recorded already answers from its marker."""
        await retry_while_running(lambda: self.work(msg), "intake message", self._stop,
                                  stream=self.stream, subject=msg.subject)

    async def _dead_letter(self, msg: Msg, reason: str) -> None:
        """Keep the message in the dead-letter stream, then give it up (terminate it);
        left in its stream when that cannot be done before the intake stops."""
        meta = msg.metadata
        headers = {"Vb-Subject": msg.subject, "Vb-Sequence": str(meta.sequence.stream),
                   "Vb-Reason": reason[:1000],
                   "Nats-Msg-Id": f"dead:{self.stream}:{meta.sequence.stream}"}
        try:  # kept before it is given up: a dead letter NATS cannot take now is tried again
            await retry_while_running(lambda: self.nc.jetstream().publish(
                self.layout.dead_letter_subject(self.stream), msg.data, headers=headers),
                "dead-lettering a message", self._stop, stream=self.stream)
        except (NatsError, TimeoutError) as e:  # stopped, or no dead-letter stream at all
            log.error("message not dead-lettered; it stays in its stream", stream=self.stream,
                      subject=msg.subject, sequence=meta.sequence.stream, reason=reason,
                      error=str(e) or type(e).__name__)
            return
        self.dead_letters += 1
        log.warning("message dead-lettered", stream=self.stream, subject=msg.subject,
                    sequence=meta.sequence.stream, reason=reason,
                    dead_letters_total=self.dead_letters)
        await _quietly(msg.term())


async def _first(*waits: Coroutine[Any, Any, object], timeout: float) -> bool:
    """Wait until the first of `waits` is done (the others are cancelled); False on timeout."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    done, pending = await asyncio.wait(tasks, timeout=timeout,
                                       return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return bool(done)


async def _quietly(action: Awaitable[object]) -> None:
    """An ack-side call whose failure only means the message comes back: logged, not raised."""
    try:
        await action
    except (NatsError, TimeoutError) as e:
        log.warning("intake could not settle a message", error=repr(e))


def decode_command(msg: Msg) -> Command:
    try:
        command = _decode_command(msg.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise DeadLetter(f"not a command: {e}") from None
    if not 0 < len(command.id) <= MAX_ID_LENGTH:
        raise DeadLetter(f"id: must be 1 to {MAX_ID_LENGTH} characters")
    return command


async def _until_ready(ready: asyncio.Event | None, stop: asyncio.Event) -> bool:
    """Wait for the writer's memory to hold the whole log (the control loop caught up), so
    the first decision already knows every event still waiting for its command's marker
    (`Memory.unmarked`); False if stopped first."""
    return ready is None or await unless_stopped(ready.wait(), stop)


class CommandIntake:
    def __init__(self, nc: Client, layout: Layout, writer: Writer,
                 policy: Policy | None = None, ready: asyncio.Event | None = None) -> None:
        self.nc = nc
        self.layout = layout
        self.writer = writer
        self.policy = policy or Policy.open()
        self.ready = ready
        self.announcer = Announcer(nc, layout)

    async def run(self, stop: asyncio.Event) -> None:
        if not await _until_ready(self.ready, stop):
            return
        bucket = await retry_until_stopped(  # there before any outcome is put in it
            lambda: self.nc.jetstream().key_value(self.layout.outcomes_bucket),
            "binding the outcomes bucket", stop)
        if bucket is None:  # stopped first
            return
        try:
            await Consumer(self.nc, self.layout, stream=self.layout.commands_stream,
                           subject=self.layout.commands_filter, durable=COMMANDS_CONSUMER,
                           work=self.handle).run(stop)
        finally:
            await self.announcer.close()

    async def handle(self, msg: Msg) -> None:
        command = decode_command(msg)
        sender = self.layout.command_actor(msg.subject)  # whom the server vouches for
        verdict = admission_verdict(command, sender, self.policy)
        key = outcome_key(sender, command.id)  # not a forged actor's: nothing lands there

        async def announce(outcome: Outcome) -> None:  # sent before the command's ack
            await self.announcer.announce(key, outcome)

        if verdict is not None:
            log.warning("command refused", command_id=command.id, actor=command.actor,
                        kind=command.kind, verb=command.verb, reason=verdict.reason)
            await announce((await self.writer.handler.record_refusal(command, verdict)).outcome)
        else:
            await self.writer.execute(command, announce)


def admission_verdict(command: Command, subject_actor: str, policy: Policy) -> Verdict | None:
    """Why a client's command is not the client's to give, or None.

    The subject's actor token is the one the server vouches for (each user may publish only
    under its own); the body must agree. `system:` actors and internal verbs belong to the
    control plane's own controllers and to the reports it turns into commands, which never
    pass through the command stream. Then the policy decides, as Kubernetes RBAC would
    decide the request `kubectl`/`virtctl` make for the same thing."""
    if command.actor != subject_actor:
        return Verdict(f"actor {command.actor!r} does not match the subject's "
                       f"{subject_actor!r}", "actor")
    if command.actor.startswith(SYSTEM_ACTOR_PREFIX):
        return Verdict(f"actor {command.actor!r}: {SYSTEM_ACTOR_PREFIX}* actors are the "
                       "control plane's own", "actor")
    if (command.kind, command.verb) in INTERNAL_VERBS:
        return Verdict(f"{command.kind} {command.verb!r} is decided by the control plane "
                       "itself, not accepted as a command", "verb")
    request = command_request(command.kind, command.verb, command.namespace,
                              command.manifest)
    if not policy.allows(command.actor, request):
        return Verdict(f"forbidden: User {command.actor!r} {request}")
    return None


class ReportIntake:
    """Observations become commands; the control plane, not the agent, decides what they mean."""

    def __init__(self, nc: Client, layout: Layout, writer: Writer,
                 ready: asyncio.Event | None = None) -> None:
        self.nc = nc
        self.layout = layout
        self.writer = writer
        self.ready = ready

    async def run(self, stop: asyncio.Event) -> None:
        if not await _until_ready(self.ready, stop):
            return
        await Consumer(self.nc, self.layout, stream=self.layout.reports_stream,
                       subject=self.layout.reports_filter, durable=REPORTS_CONSUMER,
                       work=self.handle).run(stop)

    async def handle(self, msg: Msg) -> None:
        try:
            report = _decode_report(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise DeadLetter(f"not a node report: {e}") from None
        node = self.layout.report_node(msg.subject)
        if report.node != node:  # the subject is what the server vouches for
            raise DeadLetter(f"node: the report names {report.node!r}, its subject {node!r}")
        command = report_command(report)
        if command is not None:
            result = await self.writer.execute(command)
            if not result.outcome.accepted:
                log.debug("report changed nothing", node=report.node,
                          reason=result.outcome.reason)


def report_command(report: NodeReport) -> Command | None:
    command_id = name_uuid(_REPORT_IDS, report.id)
    actor = node_actor(report.node)
    match report.kind:
        case "node" if report.info is not None:
            return Command(id=command_id, actor=actor, kind="Node", verb="register",
                           name=report.node, manifest=report.info)
        case "domain" if report.domain is not None:
            obs = report.domain
            return Command(id=command_id, actor=actor, kind="VirtualMachineInstance",
                           verb="observe", namespace=obs.namespace, name=obs.name,
                           manifest=msgspec.to_builtins(obs),
                           correlation_id=report.correlation_id)
        case "interfaces" if report.interfaces is not None:
            seen_nics = report.interfaces
            return Command(id=command_id, actor=actor, kind="VirtualMachineInstance",
                           verb="observe-interfaces", namespace=seen_nics.namespace,
                           name=seen_nics.name, manifest=msgspec.to_builtins(seen_nics),
                           correlation_id=report.correlation_id)
        case "migration" if report.migration is not None:
            seen = report.migration  # named by its VMI: the VMI knows its migration
            return Command(id=command_id, actor=actor, kind="VirtualMachineInstanceMigration",
                           verb="observe", namespace=seen.namespace, name=seen.name,
                           manifest=msgspec.to_builtins(seen),
                           correlation_id=report.correlation_id)
        case _:
            return None

"""Intake: commands from clients and reports from node agents, each from a durable consumer,
each acknowledged only after its outcome is recorded. A crash before the ack redelivers the
message, and command idempotence makes the second delivery answer, not act."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from controlplane.defaults import INTAKE_BATCH
from controlplane.writer import Writer
from events.aio import ACK_WAIT_SECONDS, claimed
from events.messages import Command, NodeReport, Outcome
from events.subjects import Layout, encode_token

log = structlog.get_logger(__name__)

COMMANDS_CONSUMER = "controlplane-commands"
REPORTS_CONSUMER = "controlplane-reports"
_REPORT_IDS = uuid.UUID("5b0e1c77-3f41-5d2e-8a6b-1c9d0e7f2a34")

_decode_command = msgspec.msgpack.Decoder(Command).decode
_decode_report = msgspec.msgpack.Decoder(NodeReport).decode
_encode = msgspec.msgpack.Encoder().encode


async def _consume(nc: Client, stream: str, subject: str, durable: str, *,
                   handle: Callable[[Msg], Awaitable[None]], stop: asyncio.Event) -> None:
    js = nc.jetstream()
    sub = await js.pull_subscribe(subject, durable=durable, stream=stream, config=ConsumerConfig(
        ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT_SECONDS, max_ack_pending=1000))
    while not stop.is_set():
        try:
            msgs = await sub.fetch(INTAKE_BATCH, timeout=1.0)
        except TimeoutError:
            continue
        for msg in msgs:
            async with claimed(msg):
                await handle(msg)
            await msg.ack()


class CommandIntake:
    def __init__(self, nc: Client, layout: Layout, writer: Writer) -> None:
        self.nc = nc
        self.layout = layout
        self.writer = writer

    async def run(self, stop: asyncio.Event) -> None:
        self.outcomes = await self.nc.jetstream().key_value(self.layout.outcomes_bucket)
        await _consume(self.nc, self.layout.commands_stream, self.layout.commands_filter,
                       COMMANDS_CONSUMER, handle=self.handle, stop=stop)

    async def handle(self, msg: Msg) -> None:
        try:
            command = _decode_command(msg.data)
        except msgspec.DecodeError as e:
            log.warning("undecodable command dropped", subject=msg.subject, error=str(e))
            return
        key = encode_token(command.id)
        actor = self.layout.command_actor(msg.subject)
        if command.actor != actor:
            outcome = Outcome(command_id=command.id, accepted=False, field="actor",
                              reason=f"actor {command.actor!r} does not match the subject's "
                                     f"{actor!r}")
        else:
            outcome = (await self.writer.execute(command, check_prior=True)).outcome
        await self.outcomes.put(key, _encode(outcome))


class ReportIntake:
    """Observations become commands; the control plane, not the agent, decides what they mean."""

    def __init__(self, nc: Client, layout: Layout, writer: Writer) -> None:
        self.nc = nc
        self.layout = layout
        self.writer = writer

    async def run(self, stop: asyncio.Event) -> None:
        await _consume(self.nc, self.layout.reports_stream, self.layout.reports_filter,
                       REPORTS_CONSUMER, handle=self.handle, stop=stop)

    async def handle(self, msg: Msg) -> None:
        try:
            report = _decode_report(msg.data)
        except msgspec.DecodeError as e:
            log.warning("undecodable report dropped", subject=msg.subject, error=str(e))
            return
        command = report_command(report)
        if command is not None:
            result = await self.writer.execute(command)
            if not result.outcome.accepted:
                log.debug("report changed nothing", node=report.node,
                          reason=result.outcome.reason)


def report_command(report: NodeReport) -> Command | None:
    command_id = str(uuid.uuid5(_REPORT_IDS, report.id))
    actor = f"system:node:{report.node}"
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
        case _:
            return None

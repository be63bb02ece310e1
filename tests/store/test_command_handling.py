"""Command handling on the real store: one outcome per command id, however often it is
delivered, even when today's state would decide differently."""

from __future__ import annotations

import uuid

from controlplane.handling import CommandHandler
from events.messages import Command
from tests.system.harness import vm_manifest


def command(verb: str, **fields: object) -> Command:
    return Command(id=str(uuid.uuid4()), actor="user:dana", kind="VirtualMachine", verb=verb,
                   namespace="default", name="web", **fields)  # type: ignore[arg-type]


def test_a_redelivered_command_gets_its_first_outcome(handler: CommandHandler) -> None:
    created = handler.execute(command("apply", manifest=vm_manifest("web", "Halted")))
    start = command("start")
    first = handler.execute(start, check_prior=True)
    assert first.outcome.accepted and len(first.outcome.sequences) == 1
    # Delivered again (a crash before its outcome was stored): today's state says Always,
    # where a fresh start would be refused; the command's own outcome is the answer.
    again = handler.execute(start, check_prior=True)
    assert again.outcome == first.outcome
    fresh = handler.execute(command("start"), check_prior=True)
    assert not fresh.outcome.accepted
    assert "Always does not support manual start" in fresh.outcome.reason
    assert created.outcome.sequences[0] < first.outcome.sequences[0]

"""Command handling on the real store: one outcome per command id, however often it is
delivered, even when today's state would decide differently."""

from __future__ import annotations

import uuid

from events.jetstream.store import JetStreamApplicationRecorder
from events.language.messages import Command
from tests.store.helpers import SyncHandler
from tests.system.harness import vm_manifest


def command(verb: str, **fields: object) -> Command:
    return Command(id=str(uuid.uuid4()), actor="user:dana", kind="VirtualMachine", verb=verb,
                   namespace="default", name="web", **fields)  # type: ignore[arg-type]


def test_a_redelivered_command_gets_its_first_outcome(handler: SyncHandler) -> None:
    created = handler.execute(command("apply", manifest=vm_manifest("web", "Halted")))
    start = command("start")
    first = handler.execute(start)
    assert first.outcome.accepted and len(first.outcome.sequences) == 1
    # Delivered again (a crash before its outcome was stored): today's state says Always,
    # where a fresh start would be refused; the command's own outcome is the answer.
    again = handler.execute(start)
    assert again.outcome == first.outcome
    fresh = handler.execute(command("start"))
    assert not fresh.outcome.accepted
    assert "Always does not support manual start" in fresh.outcome.reason
    assert created.outcome.sequences[0] < first.outcome.sequences[0]


def test_a_spec_kubevirt_would_refuse_is_refused_at_apply(handler: SyncHandler) -> None:
    """Admission runs every VMI spec rule on the VM's template: nothing but the command's
    refusal is appended (before, such a VM was accepted and its VMI failed on the node)."""
    recorder = handler.recorder
    assert isinstance(recorder, JetStreamApplicationRecorder)
    manifest = vm_manifest("huge", memory="64Mi")
    manifest["spec"]["template"]["spec"]["domain"]["memory"] = {"hugepages": {"pageSize": "1Gi"}}
    before = recorder.max_notification_id()
    refused = handler.execute(command("apply", manifest=manifest)).outcome
    assert not refused.accepted
    assert refused.field == "spec.template.spec.domain.memory.hugepages.pageSize"
    assert refused.reason == "hugepages size cannot be bigger than requested memory"
    [marker] = recorder.select_notifications(before or 0, 10, inclusive_of_start=False)
    assert marker.topic == "CommandRejected.v1"

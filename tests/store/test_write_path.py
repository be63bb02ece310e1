"""The write path's guarantees, each shown failing without its mechanism (README, guarantees).

Two writers here are two `Writer`s on connections of their own, each with its own memory:
what two control-plane replicas racing across a lease handover look like. The
events stream's duplicate window is cut to the server's minimum (100 ms) and waited out
where a test needs a stale write to reach the expectation check, not the dedupe.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg

from controlplane.clusterconfig import KUBEVIRT_CR_ID
from controlplane.decision import HANDLERS, Decision, Verdict, handles
from controlplane.hco.controller import HCOController
from controlplane.memory import Scan
from controlplane.writeprotocol import nobody
from controlplane.writer import Writer
from events.api import hco_defaults as d
from events.jetstream.connect import connect
from events.jetstream.datastore import AppendConflict, Outgoing
from events.jetstream.directget import read_all, sequence
from events.jetstream.streams import ensure_all, events_stream_config
from events.language.kinds.vm import VirtualMachineDeleted
from events.language.messages import Command, Outcome
from events.language.subjects import Layout
from projections.cluster import ClusterState
from projections.follower import read_event
from projections.kinds.vm import VirtualMachineView
from tests.system.harness import vm_manifest

WINDOW = 0.1
"""The events stream's duplicate window in these tests: the server's minimum."""


class Writers:
    def __init__(self, layout: Layout, connections: list[Nats], complete: bool) -> None:
        self.layout = layout
        self.connections = connections
        self.a, self.b = (Writer(nc, layout) for nc in connections)
        for writer in (self.a, self.b):
            writer.handler.memory.complete = complete

    async def versions(self, agg_id: str) -> list[int]:
        """Every version stored for `agg_id`, in log order."""
        msgs = await read_all(self.connections[0], self.layout.events_stream,
                              self.layout.aggregate_subject(agg_id))
        return [e.originator_version for m in msgs if (e := read_event(m)) is not None]


@pytest.fixture(params=[False, True], ids=["reading-memory", "complete-memory"])
async def writers(nats_url: str, prefix: str,
                  request: pytest.FixtureRequest) -> AsyncIterator[Writers]:
    """Two writers whose memories read what they lack from the log, or take themselves as
    complete (as the control loop's does, once it has folded the log) and so store a lone
    event without a batch (`CommandHandler._alone`); nothing feeds them the log here, so a
    complete one is behind whatever the other writes."""
    layout = Layout(prefix)
    connections = [await connect(nats_url, f"writer-{n}") for n in "ab"]
    js = connections[0].jetstream()
    await ensure_all(js, layout)
    config = events_stream_config(layout)
    config.duplicate_window = WINDOW
    await js.update_stream(config)
    try:
        yield Writers(layout, connections, request.param)
    finally:
        for nc in connections:
            await nc.close()


def command(verb: str, name: str = "web", actor: str = "user:dana", **fields: Any) -> Command:
    return Command(id=str(uuid.uuid4()), actor=actor, kind="VirtualMachine", verb=verb,
                   namespace="default", name=name, **fields)


def apply(name: str, memory: str = "64Mi") -> Command:
    return command("apply", name, manifest=vm_manifest(name, "Halted", memory=memory))


VM = "vm.default.web"


async def test_a_refusal_is_final_however_the_object_changes(writers: Writers) -> None:
    """The issue's sequence: `start web` while web does not exist is refused; web is
    applied; the same command delivered again is refused again and changes nothing."""
    start = command("start")
    refused = (await writers.a.execute(start)).outcome
    assert not refused.accepted and refused.field == "metadata.name"
    assert (await writers.a.execute(apply("web"))).outcome.accepted
    for handler in (writers.a, writers.b):  # the same replica, and a fresh one
        again = await handler.execute(start)
        assert again.outcome == refused and again.events == []
    assert await writers.versions(VM) == [1]


async def test_an_accepted_command_delivered_again_answers_its_first_outcome(
        writers: Writers) -> None:
    assert (await writers.a.execute(apply("web"))).outcome.accepted
    start = command("start")
    first = (await writers.a.execute(start)).outcome
    assert first.accepted and len(first.sequences) == 1
    await asyncio.sleep(WINDOW * 2)  # past the stream's dedupe: only the marker can answer
    again = await writers.b.execute(start)
    assert again.outcome == first and again.events == []
    assert await writers.versions(VM) == [1, 2]


async def test_a_stale_writer_is_refused_by_the_expected_sequence(writers: Writers) -> None:
    """Writer a decides on version 1 it holds in memory while b has written version 2; a's
    append reaches the server after the dedupe window, so only the expected sequence
    stands between it and a second version 2."""
    assert (await writers.a.execute(apply("web", "64Mi"))).outcome.accepted
    assert (await writers.b.execute(apply("web", "96Mi"))).outcome.accepted
    scans: dict[str, Scan] = {}
    decision, verdict = await writers.a.handler._decide(apply("web", "128Mi"), scans, _quiet())
    assert verdict is None and [e.originator_version for e in decision.events] == [2]
    await asyncio.sleep(WINDOW * 2)
    with pytest.raises(AppendConflict):
        await writers.a.handler.log.publish(stored_as(writers.a, decision, verdict))
    assert await writers.versions(VM) == [1, 2]


async def test_an_object_forgotten_after_a_conflict_is_not_rebuilt_from_one_event(
        writers: Writers) -> None:
    """Writer a forgets web after a conflict (its view was stale); the control loop then
    folds b's newer event before a reads web again. A view made of that one event would
    hold web's last sequence without its creation: a decision on it (web absent) passes its
    guard. Seen in a lease handover under load, where the new leader refused a node's report
    of a running VMI as "no such VMI instance", and the VMI never became Running."""
    assert (await writers.a.execute(apply("web", "64Mi"))).outcome.accepted
    memory = writers.a.handler.memory
    seen = memory.views[VM].last_sequence
    assert (await writers.b.execute(apply("web", "96Mi"))).outcome.accepted
    memory.forget(VM, seen)
    msgs = await read_all(writers.connections[0], writers.layout.events_stream,
                          writers.layout.aggregate_subject(VM))
    newest = msgs[-1]
    event = read_event(newest)
    assert event is not None and event.originator_version == 2
    memory.observe(event, sequence(newest))
    assert (await writers.a.execute(apply("web", "128Mi"))).outcome.accepted
    msgs = await read_all(writers.connections[0], writers.layout.events_stream,
                          writers.layout.aggregate_subject(VM))
    assert [type(e).__name__ for m in msgs if (e := read_event(m)) is not None] == [
        "VirtualMachineCreated", "VirtualMachineUpdated", "VirtualMachineUpdated"]


def stored_as(writer: Writer, decision: Decision, verdict: Verdict | None) -> list[Outgoing]:
    """What the writer publishes for a decision: its lone event, or its atomic batch."""
    alone = writer.handler._alone(decision, verdict)
    return [alone] if alone is not None else writer.handler._batch(decision, verdict)


async def test_a_conflict_is_decided_again_on_fresh_state(writers: Writers) -> None:
    """The same: through `execute`, the stale decision is retried and accepted as version 3,
    with the memory of the write that came last."""
    assert (await writers.a.execute(apply("web", "64Mi"))).outcome.accepted
    assert (await writers.b.execute(apply("web", "96Mi"))).outcome.accepted
    await asyncio.sleep(WINDOW * 2)
    result = await writers.a.execute(apply("web", "128Mi"))
    assert result.outcome.accepted
    assert [e.originator_version for _, e in result.events] == [3]
    assert await writers.versions(VM) == [1, 2, 3]


async def test_concurrent_writers_on_one_object_each_get_one_outcome(
        writers: Writers) -> None:
    """Two writers with their own memories, many commands each, all at once: conflicts
    happen (more than one writer in flight) and every command ends accepted, each version
    stored once, in order."""
    assert (await writers.a.execute(apply("web"))).outcome.accepted
    memories = [f"{64 + 2 * i}Mi" for i in range(40)]
    commands = [apply("web", m) for m in memories]
    results = await asyncio.gather(*[
        (writers.a if i % 2 else writers.b).execute(c) for i, c in enumerate(commands)])
    outcomes: list[Outcome] = [r.outcome for r in results]
    assert all(o.accepted for o in outcomes), [o.reason for o in outcomes if not o.accepted]
    versions = await writers.versions(VM)
    assert versions == list(range(1, len(versions) + 1))
    changed = sum(bool(o.sequences) for o in outcomes)
    assert len(versions) == 1 + changed


async def test_a_decision_on_an_absence_is_guarded(writers: Writers) -> None:
    """Write skew: changing the workloads' node placement is allowed only while no VM
    exists. A HyperConverged apply decided on "no VM" must not land after a VM was
    created meanwhile: its read guard on every VM (`ev.vm.>`) refuses it."""
    hco = {"apiVersion": d.API_VERSION, "kind": d.KIND,
           "metadata": {"name": d.DEFAULT_NAME, "namespace": d.DEFAULT_NAMESPACE},
           "spec": {}}
    placement = {**hco, "spec": {"workloads": {"nodePlacement": {
        "nodeSelector": {"zone": "a"}}}}}
    create = Command(id=str(uuid.uuid4()), actor="user:ops", kind=d.KIND, verb="apply",
                     name=d.DEFAULT_NAME, namespace=d.DEFAULT_NAMESPACE, manifest=hco)
    assert (await writers.a.execute(create)).outcome.accepted
    change = Command(id=str(uuid.uuid4()), actor="user:ops", kind=d.KIND, verb="apply",
                     name=d.DEFAULT_NAME, namespace=d.DEFAULT_NAMESPACE, manifest=placement)
    scans: dict[str, Scan] = {}
    decision, verdict = await writers.a.handler._decide(change, scans, _quiet())
    assert verdict is None and scans["vm"].ids == []
    assert (await writers.b.execute(apply("web"))).outcome.accepted  # the first VM
    with pytest.raises(AppendConflict):
        await writers.a.handler.log.publish(writers.a.handler._batch(decision, verdict))
    # Decided again, on the state with the VM, it is refused.
    refused = (await writers.a.execute(change)).outcome
    assert not refused.accepted and "workloads" in refused.field


def _quiet() -> Any:
    return structlog.get_logger("test")


async def test_a_decision_on_an_object_it_only_read_is_guarded(writers: Writers) -> None:
    """The VM controller's create-for-vm reads the VM (it must still want to run) and writes
    only the VMI. Decided while the VM ran, it must not land after the VM was stopped: its
    read guard on the VM refuses it, and decided again it is refused as no longer needed."""
    manifest = vm_manifest("web", "Always")
    assert (await writers.a.execute(command("apply", manifest=manifest))).outcome.accepted
    create = Command(id=str(uuid.uuid4()), actor="system:controller:vm",
                     kind="VirtualMachineInstance", verb="create-for-vm", namespace="default",
                     name="web")
    scans: dict[str, Scan] = {}
    decision, verdict = await writers.a.handler._decide(create, scans, _quiet())
    assert verdict is None and [type(e).__name__ for e in decision.events] == [
        "VirtualMachineInstanceCreated"]
    assert (await writers.b.execute(command("stop"))).outcome.accepted
    with pytest.raises(AppendConflict):
        await writers.a.handler.log.publish(writers.a.handler._batch(decision, verdict))
    refused = (await writers.a.execute(create)).outcome
    assert not refused.accepted and refused.reason == "no longer needed"
    assert await writers.versions("vmi.default.web") == []


async def test_a_command_whose_kind_and_manifest_disagree_is_refused(writers: Writers) -> None:
    """It used to trip an assert and stop the control plane, and its standby, for good."""
    mismatched = Command(id=str(uuid.uuid4()), actor="user:mallory",
                         kind="VirtualMachineInstance", verb="apply",
                         manifest=vm_manifest("web"))
    refused = (await writers.a.execute(mismatched)).outcome
    assert (refused.accepted, refused.field) == (False, "kind")
    assert "VirtualMachine" in refused.reason
    assert (await writers.a.execute(apply("web"))).outcome.accepted  # and it goes on


async def test_a_handler_that_fails_refuses_its_command_and_changes_nothing(
        writers: Writers) -> None:
    """A bug met by one command (here a handler that raises) refuses that command, once and
    for good; the writer carries on with the next."""

    def broken(d: Decision) -> None:
        d.trigger(d.target("vm", VirtualMachineView), VirtualMachineDeleted)
        raise RuntimeError("a bug")

    handles("VirtualMachine", "break")(broken)
    try:
        refused = (await writers.a.execute(command("break"))).outcome
    finally:
        del HANDLERS[("VirtualMachine", "break")]
    assert not refused.accepted and "RuntimeError" in refused.reason
    assert await writers.versions(VM) == []
    assert (await writers.a.execute(apply("web"))).outcome.accepted


async def set_gates(writer: Writer, state: ClusterState, **gates: bool) -> None:
    """A HyperConverged with these featureGates, and the KubeVirt CR the HCO controller
    derives from it, written by `writer` and folded into `state`."""
    hco = {"apiVersion": d.API_VERSION, "kind": d.KIND,
           "metadata": {"name": d.DEFAULT_NAME, "namespace": d.DEFAULT_NAMESPACE},
           "spec": {"featureGates": gates}}
    apply_hco = Command(id=str(uuid.uuid4()), actor="user:ops", kind=d.KIND, verb="apply",
                        name=d.DEFAULT_NAME, namespace=d.DEFAULT_NAMESPACE, manifest=hco)
    for commands in ([apply_hco], None):
        for c in commands if commands is not None else HCOController().reconcile(state):
            result = await writer.execute(c)
            assert result.outcome.accepted, result.outcome.reason
            for seq, event in result.events:
                state.apply(event, seq)


async def test_a_decision_on_the_feature_gates_is_guarded(writers: Writers) -> None:
    """A VM that uses a gated feature is admitted on the gates of now: decided while its
    gate is on, it must not land after the gate was turned off (its read guard on the
    KubeVirt CR refuses it), and decided again it is refused. A VM that uses no gated
    feature does not depend on the gates: its decision reads the VM only."""
    state = ClusterState()
    await set_gates(writers.a, state, downwardMetrics=True)
    manifest = vm_manifest("web", "Halted")
    manifest["spec"]["template"]["spec"]["domain"]["devices"]["downwardMetrics"] = {}
    gated = command("apply", manifest=manifest)
    decision, verdict = await writers.a.handler._decide(gated, {}, _quiet())
    assert verdict is None and set(decision.seen) == {VM, KUBEVIRT_CR_ID}
    ungated, _ = await writers.a.handler._decide(apply("db"), {}, _quiet())
    assert set(ungated.seen) == {"vm.default.db"}
    await set_gates(writers.b, state, downwardMetrics=False)
    with pytest.raises(AppendConflict):
        await writers.a.handler.log.publish(stored_as(writers.a, decision, verdict))
    refused = (await writers.a.execute(gated)).outcome
    assert not refused.accepted
    assert refused.field == "spec.template.spec.domain.devices.downwardMetrics"
    assert await writers.versions(VM) == []


async def test_a_command_delivered_again_after_its_object_changed_changes_nothing(
        writers: Writers) -> None:
    """An apply accepted, then another apply of the same VM: the first delivered again
    (past the dedupe window) answers its first outcome, and the VM keeps the second spec.
    Decided again, the first would store one event on the one object it read, without a
    batch holding its marker's guard: only looking the marker up first stops it."""
    first = apply("web", "64Mi")
    accepted = (await writers.a.execute(first)).outcome
    assert accepted.accepted
    assert (await writers.a.execute(apply("web", "96Mi"))).outcome.accepted
    await asyncio.sleep(WINDOW * 2)
    again = await writers.a.execute(first)
    assert again.outcome == accepted and again.events == []
    assert await writers.versions(VM) == [1, 2]


async def test_a_marker_folded_after_the_look_up_counts(writers: Writers) -> None:
    """Two writers at one command: b records it (and a later change) after a looked its
    marker up and found none; a's memory folds b's marker before a decides (as its control
    loop feeds it), so a answers b's outcome and stores nothing."""
    first = apply("web", "64Mi")
    accepted = (await writers.b.execute(first)).outcome
    assert (await writers.b.execute(apply("web", "96Mi"))).outcome.accepted
    for msg in await read_all(writers.connections[0], writers.layout.events_stream,
                              writers.layout.events_filter()):
        event = read_event(msg)
        assert event is not None
        writers.a.handler.memory.observe(event, sequence(msg))
    await asyncio.sleep(WINDOW * 2)
    nothing: asyncio.Future[Msg | None] = asyncio.get_running_loop().create_future()
    nothing.set_result(None)  # the look-up, answered before b's marker was stored
    again = await writers.a.handler._execute(first, nothing, nobody, _quiet())
    assert again.outcome == accepted and again.events == []
    assert await writers.versions(VM) == [1, 2]

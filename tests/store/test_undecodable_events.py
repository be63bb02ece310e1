"""No message in the log can stop a reader: one this version cannot decode (no `Vb-Topic`, an
unknown type, a future schema, a body that does not decode) is skipped, logged and counted;
an event that does not fit its view is ignored; every valid event still comes, once, in
order."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg
from prometheus_client.parser import text_string_to_metric_families

from events.api.base import ObjectMeta
from events.api.hco import HyperConvergedSpec
from events.api.manifest import decode_object
from events.api.node import NodeInfo
from events.api.vm import VirtualMachine
from events.authorization.policy import Policy
from events.jetstream.connect import connect
from events.jetstream.datastore import TOPIC_HEADER
from events.jetstream.streams import ensure_all
from events.language.codec import Event, encode
from events.language.kinds.hco import (
    HyperConvergedCreated,
    HyperConvergedUpdated,
    OperandApplied,
    OperandReverted,
    hco_id,
)
from events.language.kinds.nodes import (
    NODE_KIND,
    NodeInfoChanged,
    NodeNotReady,
    NodeReady,
    NodeRegistered,
)
from events.language.kinds.vm import (
    VM_KIND,
    VMI_KIND,
    VirtualMachineCreated,
    VirtualMachineInstanceCreated,
    VirtualMachineInstancePhaseChanged,
    VirtualMachineRunStrategyChanged,
)
from events.language.query import Query, ask
from events.language.subjects import Layout, aggregate_id
from projections import audit, follower, service, views
from projections.cluster import ClusterState
from projections.follower import (
    BAD_TOPIC,
    FUTURE_SCHEMA,
    NO_TOPIC,
    UNDECODABLE,
    UNKNOWN_TYPE,
    read_event,
)
from projections.hco import METRICS_QUERY, metrics
from projections.hco_metrics import EVENTS_SKIPPED
from projections.http import respond
from projections.kinds.hco import HyperConvergedView, OperandView
from projections.kinds.vm import VirtualMachineInstanceView

NODE = aggregate_id(NODE_KIND, "", "n1")
T0 = datetime(2025, 1, 1, tzinfo=UTC)
REASONS = [NO_TOPIC, UNKNOWN_TYPE, FUTURE_SCHEMA, UNDECODABLE]
"""The strays `build` puts between valid events, in this order."""


def _base(agg: str, version: int) -> dict[str, Any]:
    return {"originator_id": agg, "originator_version": version, "timestamp": T0,
            "actor": "user:test", "correlation_id": "c", "causation_id": "c"}


def node_event(version: int) -> Event:
    """Node n1's event at `version`: registered, then Ready / NotReady / info changes."""
    info = NodeInfo(node_name="n1", hostname="n1", architecture="x86_64",
                    hypervisor_uri="test:///default", domain_type="qemu",
                    libvirt_version="10.0.0", capacity={"cpu": "8"}, allocatable={"cpu": "8"})
    if version == 1:
        return NodeRegistered(**_base(NODE, 1), info=info)
    if version % 3 == 2:
        return NodeReady(**_base(NODE, version))
    if version % 3 == 0:
        return NodeNotReady(**_base(NODE, version), reason="NodeStatusUnknown")
    return NodeInfoChanged(**_base(NODE, version), info=info)


class Log:
    """A fresh prefix's events stream, written straight (not through the store), so it can
    hold what the store would never write."""

    def __init__(self, nc: Nats, layout: Layout) -> None:
        self.nc, self.layout = nc, layout

    @classmethod
    async def open(cls, nats_url: str, prefix: str) -> Log:
        layout = Layout(prefix)
        nc = await connect(nats_url, "test-undecodable")
        await ensure_all(nc.jetstream(), layout)
        return cls(nc, layout)

    async def publish(self, data: bytes, headers: dict[str, str] | None) -> int:
        """One message on node n1's subject; its stream sequence."""
        ack = await self.nc.jetstream().publish(self.layout.aggregate_subject(NODE), data,
                                                headers=headers)
        return int(ack.seq)

    async def valid(self, version: int) -> int:
        event = node_event(version)
        return await self.publish(encode(event), {TOPIC_HEADER: event.topic(),
                                                  "Nats-Msg-Id": str(event.id)})

    async def no_topic(self, _version: int) -> int:
        return await self.publish(b"a reply that landed on an event subject", None)

    async def unknown_type(self, version: int) -> int:
        return await self.publish(encode(NodeReady(**_base(NODE, version))),
                                  {TOPIC_HEADER: "NodeRebooted.v1"})

    async def future_schema(self, version: int) -> int:
        """A body the current class would read, as the next version: delivered (`decode`
        reads a newer schema as the current one), it would be folded and show."""
        return await self.publish(encode(NodeReady(**_base(NODE, version))),
                                  {TOPIC_HEADER: f"{NodeReady.TYPE}.v{NodeReady.SCHEMA + 1}"})

    async def undecodable(self, _version: int) -> int:
        return await self.publish(b"\xc1 not msgpack", {TOPIC_HEADER: NodeReady.topic()})

    async def build(self, first: int, *, end_on_stray: bool = False) -> tuple[list[int],
                                                                               list[int]]:
        """Valid events at versions `first`.. with one stray of each kind (`REASONS`)
        between them: (valid sequences, stray sequences)."""
        strays: list[Callable[[int], Awaitable[int]]] = [
            self.no_topic, self.unknown_type, self.future_schema, self.undecodable]
        good: list[int] = []
        bad: list[int] = []
        version = first
        for stray in strays:
            good.append(await self.valid(version))
            version += 1
            bad.append(await stray(version))
        if not end_on_stray:
            good.append(await self.valid(version))
        return good, bad


def skipped_samples(text: str) -> dict[str, float]:
    """`virtbus_events_skipped_total` by reason, from an exposition."""
    return {s.labels["reason"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == EVENTS_SKIPPED}


@pytest.mark.parametrize("phase", ["replay", "live"])
async def test_follow_skips_what_it_cannot_decode_and_delivers_the_rest_once(
        nats_url: str, prefix: str, phase: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The four strays sit between valid events and are read by the Direct Get replay (in
    pages of two, so pages end on strays) or by the live consumer: exactly the valid events
    come, in order, once each, and each stray is told to `on_skip` once, with its reason."""
    monkeypatch.setattr(follower, "PAGE", 2)
    log = await Log.open(nats_url, prefix)
    good: list[int] = []
    bad: list[int] = []
    if phase == "replay":
        good, bad = await log.build(1)
    else:
        good.append(await log.valid(1))
    delivered: list[int] = []
    skips: list[tuple[int, str]] = []
    state = ClusterState()
    stop = asyncio.Event()

    async def on_event(seq: int, event: Event) -> None:
        delivered.append(seq)
        state.apply(event, seq)
        if len(good) > 1 and seq == good[-1]:
            stop.set()

    async def on_skip(seq: int, reason: str) -> None:
        skips.append((seq, reason))
        state.skip(seq, reason)

    async def on_caught_up() -> None:
        if phase == "live":
            more_good, more_bad = await log.build(2)
            good.extend(more_good)
            bad.extend(more_bad)

    try:
        await asyncio.wait_for(follower.follow(log.nc, log.layout, on_event, on_skip=on_skip,
                                               on_caught_up=on_caught_up, stop=stop), 30)
    finally:
        await log.nc.close()
    assert delivered == good
    assert skips == list(zip(bad, REASONS, strict=True))
    assert state.skipped == Counter(REASONS)
    assert skipped_samples(metrics(state).exposition().decode()) == dict.fromkeys(REASONS, 1.0)
    node = state.node("n1")
    assert node is not None and node.version == len(good)


async def test_history_and_state_at_read_past_what_they_cannot_decode(
        nats_url: str, prefix: str) -> None:
    """The read service's audit reads (Direct Get to a point, then fold) over the same kind of
    log: the object's history lists exactly its valid events; the state at the head (a
    stray) has folded them all, counted the four strays and read past the last of them."""
    log = await Log.open(nats_url, prefix)
    try:
        good, bad = await log.build(1, end_on_stray=True)
        sight = service.PolicySight(Policy.open(), "operator", "Node", "get")
        history = await audit.object_history(log.nc, log.layout, "Node", "", "n1", sight=sight)
        state = await audit.state_at(log.nc, log.layout, bad[-1])
        before = await audit.state_at(log.nc, log.layout, good[-1])
    finally:
        await log.nc.close()
    assert [entry.sequence for entry in history] == good
    assert [entry.type for entry in history] == [node_event(v).TYPE for v in range(1, 5)]
    assert state.skipped == Counter(REASONS)
    assert state.last_sequence == bad[-1]
    node = state.node("n1")
    assert node is not None and node.version == len(good)
    assert not node.ready  # v3 NotReady holds: the future-schema NodeReady (v5) is not folded
    assert before.skipped == Counter(REASONS[:-1])


async def test_the_read_service_reads_past_a_stray_at_the_head_and_counts_it(
        nats_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A query `after` the head, when the head is no event, is answered (the read model has
    read past it, not waited for an event that never comes), and the metrics, over NATS and
    at `/metrics`, count every stray by reason."""
    log = await Log.open(nats_url, prefix)
    _, bad = await log.build(1, end_on_stray=True)
    read = service.ReadService(log.nc, log.layout)
    following = asyncio.Event()
    real_follow = follower.follow

    async def follow(*args: Any, **kwargs: Any) -> None:
        following.set()  # `run` subscribed to queries before it follows the log
        await real_follow(*args, **kwargs)

    monkeypatch.setattr(service, "follow", follow)
    stop = asyncio.Event()
    task = asyncio.ensure_future(read.run(stop))
    try:
        await asyncio.wait_for(following.wait(), 30)
        answer = await ask(log.nc, log.layout, Query(kind=METRICS_QUERY, after=bad[-1]),
                           "user:test")
        assert not answer.error, answer.error
        assert answer.sequence == bad[-1]
        [item] = answer.items
        assert skipped_samples(item["text"]) == dict.fromkeys(REASONS, 1.0)
        code, _, body = respond(read.state, service.render, "/metrics")
        assert code == 200 and skipped_samples(body.decode()) == dict.fromkeys(REASONS, 1.0)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await log.nc.close()


def msg(data: bytes, headers: dict[str, str] | None) -> Msg:
    return Msg(_client=None, subject="virtbus.ev.node._.n1", data=data,  # type: ignore[arg-type]
               headers={**(headers or {}), "Nats-Sequence": "7"})


def test_read_event_names_why_it_skips() -> None:
    """Each kind of message this version cannot decode, and a topic that is not one, is
    None with its reason; a valid one is the event."""
    event = node_event(2)
    body = encode(event)
    cases = {
        NO_TOPIC: msg(body, None),
        BAD_TOPIC: msg(body, {TOPIC_HEADER: "NodeReady"}),
        UNKNOWN_TYPE: msg(body, {TOPIC_HEADER: "NodeRebooted.v1"}),
        FUTURE_SCHEMA: msg(body, {TOPIC_HEADER: f"NodeReady.v{NodeReady.SCHEMA + 1}"}),
        UNDECODABLE: msg(b"\xc1", {TOPIC_HEADER: NodeReady.topic()}),
    }
    told: list[tuple[int, str]] = []
    for bad in cases.values():
        assert read_event(bad, on_skip=lambda seq, why: told.append((seq, why))) is None
    assert told == [(7, reason) for reason in cases]
    assert read_event(msg(body, {TOPIC_HEADER: event.topic()})) == event


# -- views: an event that does not fit is ignored, never an exception ------------------------

VM = aggregate_id(VM_KIND, "default", "web")
VMI = aggregate_id(VMI_KIND, "default", "web")


def vm_manifest() -> VirtualMachine:
    obj = decode_object({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {
            "resources": {"requests": {"memory": "64Mi"}}, "devices": {}}}}}})
    assert isinstance(obj, VirtualMachine)
    return obj


class Warnings:
    """Stands in for a module's logger: what it warned of."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def warning(self, message: str, **fields: Any) -> None:
        self.seen.append({"message": message, **fields})


def test_a_run_strategy_change_to_a_vm_never_created_is_ignored(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`VirtualMachineRunStrategyChanged` with no `VirtualMachineCreated` before it: the fold
    goes on (no exception), warns that the event does not fit (not that folding failed), the
    VM does not exist, and the log's next event folds as ever."""
    warned = Warnings()
    monkeypatch.setattr(views, "log", warned)
    state = ClusterState()
    orphan = VirtualMachineRunStrategyChanged(**_base(VM, 1), run_strategy="Always",
                                              generation=2)
    view = state.apply(orphan, 1)
    assert view is not None and view.version == 1
    assert state.vm("default", "web") is None
    assert [(w["type"], w["why"]) for w in warned.seen] == [
        ("VirtualMachineRunStrategyChanged", "a run strategy change to a VM never created")]
    vm = vm_manifest()
    state.apply(VirtualMachineCreated(**_base(VM, 2), uid="u", metadata=vm.metadata,
                                      spec=vm.spec), 2)
    state.apply(VirtualMachineRunStrategyChanged(**_base(VM, 3), run_strategy="Always",
                                                 generation=2), 3)
    created = state.vm("default", "web")
    assert created is not None and created.run_strategy == "Always"
    assert created.generation == 2


def test_a_fold_that_fails_leaves_the_view_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a view's `mutate` raises on an event, the reader goes on: the view is as it
    was but for having seen that version."""
    state = ClusterState()
    vm = vm_manifest()
    spec = vm.spec.template.spec
    state.apply(VirtualMachineInstanceCreated(**_base(VMI, 1), uid="u", metadata=vm.metadata,
                                              spec=spec), 1)
    real = VirtualMachineInstanceView.mutate

    def broken(self: VirtualMachineInstanceView, event: Event) -> None:
        real(self, event)  # rebinds `phase` and `transitions`, then fails
        raise ValueError("a view meeting what it did not expect")

    monkeypatch.setattr(VirtualMachineInstanceView, "mutate", broken)
    view = state.apply(VirtualMachineInstancePhaseChanged(**_base(VMI, 2), phase="Running"), 2)
    assert isinstance(view, VirtualMachineInstanceView)
    assert view.version == 2
    assert view.phase == "Pending" and [p for p, _ in view.transitions] == ["Pending"]


def test_a_copy_folds_without_touching_its_original() -> None:
    """`View.copy` (as a decision folds its own events into a copy): the original's lists
    are not the copy's."""
    vm = vm_manifest()
    spec = vm.spec.template.spec
    vmi = VirtualMachineInstanceView(VMI)
    vmi.apply(VirtualMachineInstanceCreated(**_base(VMI, 1), uid="u", metadata=vm.metadata,
                                            spec=spec), 1)
    copied = vmi.copy()
    copied.apply(VirtualMachineInstancePhaseChanged(**_base(VMI, 2), phase="Running"), 2)
    assert [p for p, _ in copied.transitions] == ["Pending", "Running"]
    assert [p for p, _ in vmi.transitions] == ["Pending"] and vmi.version == 1

    operand_id = aggregate_id("kubevirt", "", "kubevirt-hyperconverged")
    operand = OperandView(operand_id)
    operand.apply(OperandApplied(**_base(operand_id, 1), kind="KubeVirt", object={}), 1)
    again = operand.copy()
    again.apply(OperandReverted(**_base(operand_id, 2), kind="KubeVirt", component="kubevirt",
                                drift=[], object={}), 2)
    assert len(again.reverts) == 1 and operand.reverts == []

    hco = HyperConvergedView(hco_id())
    hco.apply(HyperConvergedCreated(**_base(hco_id(), 1), uid="u", metadata=ObjectMeta(),
                                    spec=HyperConvergedSpec(), unsafe_modifications={}), 1)
    changed = hco.copy()
    changed.apply(HyperConvergedUpdated(**_base(hco_id(), 2), metadata=ObjectMeta(),
                                        spec=HyperConvergedSpec(), generation=2,
                                        unsafe_modifications={"kubevirt": 1}), 2)
    assert len(changed.unsafe_history) == 2 and len(hco.unsafe_history) == 1

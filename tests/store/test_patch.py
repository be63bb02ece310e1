"""`patch`, decided by the control plane (`controlplane.objects.patch`) on the real store:
what it appends is what the equivalent `apply` appends; a missing object, a failing `test`
op, a stale resourceVersion and a result admission refuses are each refused naming the
field; a redelivered patch answers its first outcome; and two patches of one VM decided at
once by two writers (two connections, two memories) both land, every round."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest

from controlplane.decision import Rejected
from controlplane.objects.patch import manifest_of
from controlplane.writer import Writer
from events.api import hco_defaults as d
from events.api.kinds import kind_named
from events.api.patch import PatchBody, PatchType
from events.jetstream.connect import connect
from events.jetstream.directget import read_all
from events.jetstream.streams import ensure_all
from events.language.messages import Command
from events.language.subjects import Layout
from projections.cluster import ClusterState
from projections.follower import read_event
from projections.kinds.migration import MigrationView
from projections.kinds.vm import VirtualMachineView
from tests.store.helpers import SyncHandler, run, run_accepted
from tests.store.test_feature_gates import apply, stored_event
from tests.system.harness import vm_manifest


def patch(name: str, body: list[dict[str, Any]] | dict[str, Any], **fields: Any) -> Command:
    kind: PatchType = "json" if isinstance(body, list) else "merge"
    return Command(id=str(uuid.uuid4()), actor="user:erin", kind="VirtualMachine",
                   verb="patch", namespace="default", name=name,
                   manifest=msgspec.to_builtins(PatchBody(type=kind, patch=body, **fields)))


def _annotated(vm: dict[str, Any]) -> None:
    vm["metadata"]["annotations"] = {"team": "a"}


def _labelled(vm: dict[str, Any]) -> None:
    vm["metadata"]["labels"] = {"tier": "web"}


def _halted(vm: dict[str, Any]) -> None:
    vm["spec"]["runStrategy"] = "Halted"


CASES: dict[str, tuple[Any, Callable[[dict[str, Any]], None]]] = {
    "merge-annotation": ({"metadata": {"annotations": {"team": "a"}}}, _annotated),
    "json-annotation": ([{"op": "add", "path": "/metadata/annotations",
                          "value": {"team": "a"}}], _annotated),
    "merge-label": ({"metadata": {"labels": {"tier": "web"}}}, _labelled),
    "json-label": ([{"op": "add", "path": "/metadata/labels", "value": {"tier": "web"}}],
                   _labelled),
    "merge-runstrategy": ({"spec": {"runStrategy": "Halted"}}, _halted),
    "json-runstrategy": ([{"op": "replace", "path": "/spec/runStrategy", "value": "Halted"}],
                         _halted),
}


def _shape(event: Any) -> tuple[Any, ...]:
    """What an applied VM event says, but which object and when."""
    meta = event.metadata
    return (type(event).__name__, event.spec, getattr(event, "generation", 1),
            meta.labels, meta.annotations)


@pytest.mark.parametrize("case", CASES)
def test_a_patch_appends_what_the_equivalent_apply_appends(handler: SyncHandler,
                                                            case: str) -> None:
    body, change = CASES[case]
    state = ClusterState()
    for name in ("patched", "applied"):
        run_accepted(handler, state, apply(vm_manifest(name)))
    by_patch = run_accepted(handler, state, patch("patched", body)).outcome.sequences
    equivalent = copy.deepcopy(vm_manifest("applied"))
    change(equivalent)
    by_apply = run_accepted(handler, state, apply(equivalent)).outcome.sequences
    assert len(by_patch) == len(by_apply) == 1
    assert _shape(stored_event(handler, by_patch[0])) == _shape(
        stored_event(handler, by_apply[0]))
    # The same patch again changes nothing, and appends nothing.
    assert run_accepted(handler, state, patch("patched", body)).outcome.sequences == []


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"metadata": {"annotations": {"a": "b"}}}, "metadata.name", 'virtualmachine "ghost" '
                                                                 "not found"),
], ids=["missing"])
def test_a_patch_of_a_missing_object_is_refused(handler: SyncHandler, body: Any, field: str,
                                                words: str) -> None:
    outcome = run(handler, ClusterState(), patch("ghost", body)).outcome
    assert (outcome.accepted, outcome.field) == (False, field)
    assert words in outcome.reason


@pytest.mark.parametrize(("body", "field", "words", "extra"), [
    ([{"op": "test", "path": "/spec/runStrategy", "value": "Halted"},
      {"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}],
     "/spec/runStrategy", "not equal", {}),
    ([{"op": "remove", "path": "/spec/nothing"}], "/spec/nothing", "nothing", {}),
    ({"spec": {"runStrategy": "Sometimes"}}, "spec.runStrategy", "Halted", {}),
    ({"metadata": {"name": "other"}}, "metadata.name", "which object", {}),
    ({"metadata": {"annotations": {"a": "b"}}}, "metadata.resourceVersion",
     "the object has been modified; please apply your changes to the latest version",
     {"resource_version": "1"}),
], ids=["test-op-fails", "bad-path", "admission", "renamed", "stale-resource-version"])
def test_a_patch_that_cannot_apply_is_refused_naming_the_field(
        handler: SyncHandler, body: Any, field: str, words: str,
        extra: dict[str, Any]) -> None:
    state = ClusterState()
    run_accepted(handler, state, apply(vm_manifest("web")))
    run_accepted(handler, state, patch("web", {"metadata": {"labels": {"v": "2"}}}))
    outcome = run(handler, state, patch("web", body, **extra)).outcome
    assert (outcome.accepted, outcome.field) == (False, field), outcome.reason
    assert words in outcome.reason


def test_a_current_resource_version_and_overwrite(handler: SyncHandler) -> None:
    """The sequence read is the object's current one: accepted. Without `overwrite`, a
    value set to another is refused; set to the same, or a new key, is not."""
    state = ClusterState()
    [created] = run_accepted(handler, state, apply(vm_manifest("web"))).outcome.sequences
    run_accepted(handler, state, patch("web", {"metadata": {"annotations": {"a": "1"}}},
                                       resource_version=str(created)))
    refused = run(handler, state, patch("web", {"metadata": {"annotations": {"a": "2"}}},
                                        overwrite=False)).outcome
    assert (refused.accepted, refused.field) == (False, "metadata.annotations.a")
    run_accepted(handler, state, patch("web", {"metadata": {"annotations": {"a": "1", "b": "2"}}},
                                       overwrite=False))
    vm = state.vm("default", "web")
    assert vm is not None and vm.metadata.annotations == {"a": "1", "b": "2"}


def test_a_patch_delivered_again_answers_its_first_outcome(handler: SyncHandler) -> None:
    state = ClusterState()
    run_accepted(handler, state, apply(vm_manifest("web")))
    first = patch("web", {"metadata": {"annotations": {"a": "1"}}})
    outcome = run_accepted(handler, state, first).outcome
    run_accepted(handler, state, patch("web", {"metadata": {"annotations": {"a": None}}}))
    again = run(handler, state, first)
    assert again.outcome == outcome and again.events == []
    vm = state.vm("default", "web")
    assert vm is not None and vm.metadata.annotations == {}


@pytest.fixture
async def writers(nats_url: str, prefix: str) -> AsyncIterator[list[Writer]]:
    """Two writers on connections of their own, each with its own memory: two control-plane
    replicas racing."""
    layout = Layout(prefix)
    connections = [await connect(nats_url, f"writer-{n}") for n in "ab"]
    await ensure_all(connections[0].jetstream(), layout)
    try:
        yield [Writer(nc, layout) for nc in connections]
    finally:
        for nc in connections:
            await nc.close()


ROUNDS = 30


async def test_two_patches_at_once_both_land_every_round(writers: list[Writer]) -> None:
    """Each round, two writers decide a patch adding an annotation of their own to one VM at
    once: whichever is stored second was decided on what the first changed (its append
    guarded by the sequence it read, a conflict decided again on fresh state), so both
    annotations are there, every round."""
    a, b = writers
    conflicts: list[str] = []
    for writer in writers:
        forget = writer.handler.memory.forget

        def counted(agg_id: str, seen: int, forget: Any = forget) -> None:
            conflicts.append(agg_id)
            forget(agg_id, seen)

        writer.handler.memory.forget = counted  # type: ignore[method-assign]
    assert (await a.execute(apply(vm_manifest("web")))).outcome.accepted
    for n in range(ROUNDS):
        results = await asyncio.gather(
            a.execute(patch("web", {"metadata": {"annotations": {f"a{n}": "x"}}})),
            b.execute(patch("web", {"metadata": {"annotations": {f"b{n}": "x"}}})))
        assert all(r.outcome.accepted for r in results), [r.outcome for r in results]
        annotations = await _annotations(a, "vm.default.web")
        assert {f"a{n}", f"b{n}"} <= annotations.keys(), (n, annotations)
    assert len(await _annotations(a, "vm.default.web")) == 2 * ROUNDS
    assert "vm.default.web" in conflicts  # they raced: a stale decision was decided again


async def _annotations(writer: Writer, agg_id: str) -> dict[str, str]:
    """The object's annotations as the log has them, folded from its events."""
    layout = writer.handler.log.layout
    view = VirtualMachineView(agg_id)
    for msg in await read_all(writer.handler.log.nc, layout.events_stream,
                              layout.aggregate_subject(agg_id)):
        if (event := read_event(msg)) is not None:
            view.apply(event)
    return dict(view.metadata.annotations)


@pytest.mark.parametrize("namespace", ["", d.DEFAULT_NAMESPACE])
def test_the_hyperconverged_is_patched_whatever_namespace_the_command_names(
        handler: SyncHandler, namespace: str) -> None:
    """A cluster-wide object is the one object, whatever namespace the envelope says; its
    view's metadata and spec render back to what its `apply` takes (patched again, nothing
    changes)."""
    state = ClusterState()
    hco = {"apiVersion": d.API_VERSION, "kind": d.KIND,
           "metadata": {"name": d.DEFAULT_NAME, "namespace": d.DEFAULT_NAMESPACE},
           "spec": {}}
    run_accepted(handler, state, apply(hco))
    body = PatchBody(type="merge", patch={"metadata": {"annotations": {"a": "b"}}})
    command = Command(id=str(uuid.uuid4()), actor="user:erin", kind=d.KIND, verb="patch",
                      namespace=namespace, name=d.DEFAULT_NAME,
                      manifest=msgspec.to_builtins(body))
    [seq] = run_accepted(handler, state, command).outcome.sequences
    patched: Any = stored_event(handler, seq)
    assert patched.metadata.annotations == {"a": "b"}
    again = msgspec.structs.replace(command, id=str(uuid.uuid4()))
    assert run_accepted(handler, state, again).outcome.sequences == []


def test_a_kind_whose_view_keeps_no_spec_is_refused_naming_why() -> None:
    migration = kind_named("VirtualMachineInstanceMigration")
    assert migration is not None
    with pytest.raises(Rejected, match="keeps what it did, not a spec"):
        manifest_of(migration, MigrationView("vmim.default.m"))

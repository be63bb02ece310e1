"""`apply` of a namespaced object with a uid and a generation, as the presets and the replica
sets have it (`controlplane.decision.apply_namespaced`), on the real store: created with a
new uid at generation 1; changed with its uid kept, its generation counting changes of its
spec (not of its labels or annotations); applied again unchanged, nothing appended; and a
replica set's feature gates checked when it is created only, as KubeVirt's admitter does."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from projections.cluster import ClusterState
from tests.store.helpers import SyncHandler, run, run_accepted
from tests.store.test_feature_gates import apply, spec_using, stored_event
from tests.store.test_presets import SMALL, preset
from tests.store.test_replicasets import replica_set

KINDS = {
    "preset": (lambda: preset("small", SMALL), "VirtualMachineInstancePresetApplied"),
    "replicaset": (lambda: replica_set(2), "ReplicaSetApplied"),
}


def applied(handler: SyncHandler, state: ClusterState, manifest: dict[str, Any]) -> list[Any]:
    """Apply `manifest` (accepted); the events it stored (each with `uid`, `metadata`,
    `spec`, `generation`)."""
    result = run_accepted(handler, state, apply(manifest))
    return [stored_event(handler, sequence) for sequence in result.outcome.sequences]


def changed_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(manifest)
    if manifest["kind"] == "VirtualMachineInstancePreset":
        changed["spec"]["domain"]["cpu"] = {"cores": 4}
    else:
        changed["spec"]["replicas"] = 5
    return changed


@pytest.mark.parametrize("kind", KINDS)
def test_uid_kept_generation_counts_spec_changes_unchanged_appends_nothing(
        handler: SyncHandler, kind: str) -> None:
    build, event_type = KINDS[kind]
    state = ClusterState()
    manifest = build()
    [created] = applied(handler, state, manifest)
    uid = created.uid
    assert type(created).__name__ == event_type and uid and created.generation == 1

    assert applied(handler, state, manifest) == []  # the same again: nothing appended

    relabeled = copy.deepcopy(manifest)
    relabeled["metadata"]["labels"] = {"team": "a"}
    [event] = applied(handler, state, relabeled)
    assert (event.uid, event.generation, event.metadata.labels) == (uid, 1, {"team": "a"})

    annotated = copy.deepcopy(relabeled)
    annotated["metadata"]["annotations"] = {"note": "b"}
    [event] = applied(handler, state, annotated)
    assert (event.uid, event.generation, event.metadata.annotations) == (uid, 1, {"note": "b"})

    respecified = changed_spec(annotated)
    [event] = applied(handler, state, respecified)
    assert (event.uid, event.generation) == (uid, 2)
    assert applied(handler, state, respecified) == []


def test_a_replica_sets_feature_gates_are_checked_on_create_only(
        handler: SyncHandler) -> None:
    state = ClusterState()
    gated = replica_set(1)
    gated["spec"]["template"]["spec"] = spec_using("downward-metrics-device")
    refused = run(handler, state, apply(gated)).outcome
    assert (refused.accepted, refused.field) == (
        False, "spec.template.spec.domain.devices.downwardMetrics")

    run_accepted(handler, state, apply(replica_set(1)))
    [event] = applied(handler, state, gated)  # an update: KubeVirt admits it on CREATE only
    assert event.generation == 2

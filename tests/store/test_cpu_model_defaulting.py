"""KubeVirt's VMI defaulting on the real store: a VMI that names no CPU model gets the
cluster's (`defaultCPUModel` -> the KubeVirt CR's `cpuModel`), whether a VM's controller
creates it or a user applies it; applying the same manifest again stays a no-op."""

from __future__ import annotations

from projections.cluster import ClusterState
from tests.store.helpers import SyncHandler, run
from tests.store.test_feature_gates import apply, apply_hco, vmi

SPEC = {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}


def test_a_standalone_vmi_gets_the_cluster_cpu_model(handler: SyncHandler) -> None:
    state = ClusterState()
    assert apply_hco(handler, state, {"defaultCPUModel": "Skylake-Server"})["cpuModel"] \
        == "Skylake-Server"
    created = run(handler, state, apply(vmi("lone", SPEC))).outcome
    assert created.accepted and created.sequences
    view = state.vmi("default", "lone")
    assert view is not None and view.spec is not None and view.spec.domain.cpu is not None
    assert view.spec.domain.cpu.model == "Skylake-Server"

    again = run(handler, state, apply(vmi("lone", SPEC))).outcome
    assert again.accepted and not again.sequences  # the same manifest: nothing to change
    changed = {"domain": {**SPEC["domain"], "cpu": {"model": "Haswell"}}}
    refused = run(handler, state, apply(vmi("lone", changed))).outcome
    assert (refused.accepted, refused.field) == (False, "spec")
    assert refused.reason == "a VirtualMachineInstance's spec cannot change"


def test_a_named_model_is_kept(handler: SyncHandler) -> None:
    state = ClusterState()
    apply_hco(handler, state, {"defaultCPUModel": "Skylake-Server"})
    named = {"domain": {**SPEC["domain"], "cpu": {"model": "host-passthrough"}}}
    assert run(handler, state, apply(vmi("own", named))).outcome.accepted
    view = state.vmi("default", "own")
    assert view is not None and view.spec is not None and view.spec.domain.cpu is not None
    assert view.spec.domain.cpu.model == "host-passthrough"

"""KubeVirt's default pod interface on the real store: a new VMI that lists no interface and
no network gets interface `default` with the cluster's binding (HCO: masquerade; KubeVirt
alone: bridge) on the pod network, stored in its spec, whether a VM's controller creates it or
a user applies it; `autoattachPodInterface: false` or a listed interface opts out, and
applying the same manifest again stays a no-op."""

from __future__ import annotations

from typing import Any

from controlplane.vm.controller import VMController
from events.api.domain import Empty, Interface
from projections.cluster import ClusterState
from tests.store.helpers import SyncHandler, run
from tests.store.test_feature_gates import apply, apply_hco, vm, vmi

SPEC: dict[str, Any] = {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}
POD_NETWORK = [{"name": "default", "pod": {}}]


def interfaces(state: ClusterState, name: str) -> tuple[list[Interface], list[dict[str, Any]]]:
    view = state.vmi("default", name)
    assert view is not None and view.spec is not None
    return view.spec.domain.devices.interfaces, view.spec.networks


def test_a_vmi_without_interfaces_gets_the_pod_interface_with_the_clusters_binding(
        handler: SyncHandler) -> None:
    state = ClusterState()
    assert run(handler, state, apply(vmi("plain", SPEC))).outcome.accepted
    assert interfaces(state, "plain") == ([Interface(name="default", bridge=Empty())],
                                          POD_NETWORK)
    assert apply_hco(handler, state, {})["network"]["defaultNetworkInterface"] == "masquerade"
    assert run(handler, state, apply(vmi("under-hco", SPEC))).outcome.accepted
    assert interfaces(state, "under-hco") == ([Interface(name="default", masquerade=Empty())],
                                              POD_NETWORK)
    again = run(handler, state, apply(vmi("plain", SPEC))).outcome
    assert again.accepted and not again.sequences  # the same manifest: nothing to change


def test_a_vms_vmi_gets_it_too(handler: SyncHandler) -> None:
    state = ClusterState()
    apply_hco(handler, state, {})
    assert run(handler, state, apply(vm("web", SPEC, run_strategy="Always"))).outcome.accepted
    [create] = VMController().reconcile(state, "default", "web")
    assert run(handler, state, create).outcome.accepted
    assert interfaces(state, "web") == ([Interface(name="default", masquerade=Empty())],
                                        POD_NETWORK)


def test_an_opt_out_or_a_listed_interface_gets_none(handler: SyncHandler) -> None:
    state = ClusterState()
    apply_hco(handler, state, {})
    devices = {"autoattachPodInterface": False}
    opted_out = {"domain": {**SPEC["domain"], "devices": devices}}
    assert run(handler, state, apply(vmi("none", opted_out))).outcome.accepted
    assert interfaces(state, "none") == ([], [])
    listed = {"domain": {**SPEC["domain"], "devices": {"interfaces": [
        {"name": "net", "bridge": {}}]}}, "networks": [{"name": "net", "pod": {}}]}
    assert run(handler, state, apply(vmi("own", listed))).outcome.accepted
    assert interfaces(state, "own") == ([Interface(name="net", bridge=Empty())],
                                        [{"name": "net", "pod": {}}])

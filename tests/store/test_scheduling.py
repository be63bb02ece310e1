"""Scheduling through commands and read models on the real store: each filter keeps a VMI
off the nodes it should, with kube-scheduler's message, and each score picks the node it
should; a VMI waiting for a node is scheduled as soon as one fits."""

from __future__ import annotations

import uuid
from typing import Any

from controlplane.controllers.scheduler import Scheduler
from controlplane.vm.controller import VMController
from events.language.messages import Command
from projections.cluster import render_vm
from tests.store.helpers import SyncHandler, node_info
from tests.store.scheduling_helpers import Cluster
from tests.store.test_feature_gates import apply, apply_hco, vm

SSD = {"nodeSelector": {"disk": "ssd"}}
MODEL = "cpu-model.node.kubevirt.io/"
FEATURE = "cpu-feature.node.kubevirt.io/"


def test_the_unschedulable_message_counts_each_nodes_first_failure(
        handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("n1")
    c.node("n2", memory="1Gi")
    c.node("n3", memory="1Gi")
    for name in ("n2", "n3"):
        assert c.operator("label", name, labels={"disk": "ssd"}).accepted
    c.vmi("db", SSD)
    [command] = c.schedule()
    assert command.verb == "unschedulable"
    assert c.message("db") == ("0/3 nodes are available: 1 node(s) didn't match Pod's node "
                               "affinity/selector, 2 Insufficient memory.")
    assert c.schedule() == []  # the same message: no event on a resync

    c.node("n4")
    assert c.operator("label", "n4", labels={"disk": "ssd"}).accepted
    [placed] = c.schedule()  # a node fits now
    assert (placed.verb, c.node_of("db"), c.pod_scheduled("db")) == ("schedule", "n4", [])


def test_the_message_changes_when_the_reasons_do(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.vmi("lone")
    c.schedule()
    assert c.message("lone") == "no nodes available to schedule pods"
    c.node("n1", memory="512Mi")
    c.schedule()
    assert c.message("lone") == "0/1 nodes are available: 1 Insufficient memory."
    c.schedule()
    topics = [n.topic for n in c.handler.recorder.select_notifications(1, 1000)]
    assert sum("VirtualMachineInstanceUnschedulable" in t for t in topics) == 2


def test_a_vm_whose_vmi_fits_nowhere_shows_error_unschedulable(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("n1")
    c.run(apply(vm("web", {"domain": {"resources": {"requests": {"memory": "1Gi"}}},
                           **SSD}, "Always")))
    for command in VMController().resync(c.state):
        c.run(command)
    c.schedule()
    view, instance = c.state.vm("default", "web"), c.state.vmi("default", "web")
    assert view is not None and instance is not None
    assert render_vm(view, instance)["status"]["printableStatus"] == "ErrorUnschedulable"
    assert c.operator("label", "n1", labels={"disk": "ssd"}).accepted
    c.schedule()
    assert render_vm(view, c.state.vmi("default", "web"))["status"]["printableStatus"] \
        == "Starting"


def test_pods_capacity_is_counted(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("n1", pods="1")
    c.vmi("a")
    c.vmi("b")
    c.schedule()
    assert c.node_of("a") == "n1"
    assert c.message("b") == "0/1 nodes are available: 1 Too many pods."


def test_vmis_started_together_never_overcommit_a_node(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("n1", memory="3Gi")
    for name in ("a", "b", "c"):
        c.vmi(name)
    c.schedule()  # one pass decides all three
    placed = [n for n in ("a", "b", "c") if c.node_of(n)]
    assert len(placed) == 2  # 1Gi and its overhead each: the third does not fit
    [waiting] = {"a", "b", "c"} - set(placed)
    assert c.message(waiting) == "0/1 nodes are available: 1 Insufficient memory."


def test_a_waiting_vmi_takes_what_a_finished_one_frees(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("n1", memory="2Gi")
    c.vmi("a")
    c.vmi("b")
    c.schedule()
    assert c.node_of("a") == "n1" and c.message("b")
    result = c.run(Command(id=str(uuid.uuid4()), actor="system:controller:node-lifecycle",
                           kind="VirtualMachineInstance", verb="fail", namespace="default",
                           name="a", manifest={"reason": "NodeUnresponsive"}))
    [(_, failed)] = result.events
    [placed] = c.scheduler.on_event(c.state, failed)  # a's end wakes the scheduler
    c.run(placed)
    assert c.node_of("b") == "n1"


def test_taints_keep_off_what_does_not_tolerate_them(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("n1")
    c.node("n2")
    gpu = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    assert c.operator("taint", "n1", add=[gpu]).accepted
    assert c.operator("taint", "n2", add=[{**gpu, "effect": "NoExecute"}]).accepted
    c.vmi("plain")
    c.vmi("tolerant", {"tolerations": [{"key": "dedicated", "operator": "Equal",
                                        "value": "gpu", "effect": "NoSchedule"}]})
    c.vmi("any", {"tolerations": [{"key": "dedicated", "operator": "Exists"}]})
    c.schedule()
    assert c.message("plain") == ("0/2 nodes are available: 2 node(s) had untolerated taint "
                                  "{dedicated: gpu}.")
    assert c.node_of("tolerant") == "n1"  # NoExecute on n2 is not tolerated by it
    assert c.node_of("any") in ("n1", "n2")
    assert c.operator("taint", "n2", remove=[{"key": "dedicated"}]).accepted
    c.schedule()
    assert c.node_of("plain") == "n2"


def test_prefer_no_schedule_is_avoided_not_forbidden(handler: SyncHandler) -> None:
    for seed in range(4):
        c = Cluster(handler, seed=seed)
        c.node(f"soft{seed}")
        c.node(f"clean{seed}")
        soft = {"key": "spot", "effect": "PreferNoSchedule"}
        assert c.operator("taint", f"soft{seed}", add=[soft]).accepted
        c.vmi(f"v{seed}")
        c.schedule()
        assert c.node_of(f"v{seed}") == f"clean{seed}"
        assert c.operator("taint", f"clean{seed}", add=[soft]).accepted
        assert c.operator("cordon", f"soft{seed}").accepted
        c.vmi(f"w{seed}")
        c.schedule()
        assert c.node_of(f"w{seed}") == f"clean{seed}"  # tainted, still fit


def test_cordoned_nodes_take_nothing_new(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("n1")
    assert c.operator("cordon", "n1").sequences
    assert not c.operator("cordon", "n1").sequences  # already cordoned: no event
    c.vmi("v")
    c.schedule()
    assert c.message("v") == "0/1 nodes are available: 1 node(s) were unschedulable."
    node = c.state.node("n1")
    assert node is not None and node.unschedulable
    assert c.operator("uncordon", "n1").sequences
    c.schedule()
    assert c.node_of("v") == "n1"


def test_a_not_ready_node_carries_its_condition_taint(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("n1")
    c.run(Command(id=str(uuid.uuid4()), actor="system:controller:node-lifecycle", kind="Node",
                  verb="not-ready", name="n1", manifest={"reason": "NodeStatusUnknown"}))
    c.vmi("v")
    c.schedule()
    assert c.message("v") == ("0/1 nodes are available: 1 node(s) had untolerated taint "
                              "{node.kubernetes.io/unreachable: }.")


def affinity(required: list[list[dict[str, Any]]] | None = None,
             preferred: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {}
    if required is not None:
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchExpressions": e} for e in required]}
    if preferred is not None:
        node["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    return {"affinity": {"nodeAffinity": node}}


def test_required_node_affinity_terms(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("small", labels={"cpus": "4", "zone": "a"})
    c.node("big", labels={"cpus": "64", "zone": "b"})
    c.vmi("gt", affinity([[{"key": "cpus", "operator": "Gt", "values": ["8"]}]]))
    c.vmi("notin", affinity([[{"key": "zone", "operator": "NotIn", "values": ["b"]}]]))
    c.vmi("either", affinity([[{"key": "zone", "operator": "In", "values": ["z"]}],
                              [{"key": "gpu", "operator": "DoesNotExist"},
                               {"key": "zone", "operator": "In", "values": ["b"]}]]))
    c.vmi("none", affinity([[{"key": "gpu", "operator": "Exists"}]]))
    c.schedule()
    assert (c.node_of("gt"), c.node_of("notin"), c.node_of("either")) == ("big", "small", "big")
    assert c.message("none") == ("0/2 nodes are available: 2 node(s) didn't match Pod's node "
                                 "affinity/selector.")


def test_preferred_node_affinity_weights(handler: SyncHandler) -> None:
    for seed in range(4):
        c = Cluster(handler, seed=seed)
        c.node(f"a{seed}", labels={"zone": "a"})
        c.node(f"b{seed}", labels={"zone": "b", "ssd": "yes"})
        c.vmi(f"v{seed}", affinity(preferred=[
            {"weight": 10, "preference": {"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]}]}},
            {"weight": 50, "preference": {"matchExpressions": [
                {"key": "ssd", "operator": "Exists"}]}}]))
        c.schedule()
        assert c.node_of(f"v{seed}") == f"b{seed}"


def test_cpu_model_and_features_need_their_labels(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("haswell", labels={MODEL + "Haswell-noTSX": "true", FEATURE + "aes": "true"})
    c.node("conroe", labels={MODEL + "Conroe": "true", FEATURE + "avx512f": "true"})
    conroe_avx = {"domain": {"cpu": {"model": "Conroe", "features": [{"name": "avx512f"}]},
                             "resources": {"requests": {"memory": "1Gi"}}}}
    c.vmi("wanted", conroe_avx)
    forced = {"domain": {"cpu": {"features": [{"name": "aes", "policy": "force"}]},
                         "resources": {"requests": {"memory": "1Gi"}}}}
    c.vmi("forced", forced)
    forbid = {"domain": {"cpu": {"model": "host-passthrough",
                                 "features": [{"name": "aes", "policy": "forbid"}]},
                         "resources": {"requests": {"memory": "1Gi"}}}}
    c.vmi("forbid", forbid)
    nowhere = {"domain": {"cpu": {"model": "Conroe", "features": [{"name": "aes"}]},
                          "resources": {"requests": {"memory": "1Gi"}}}}
    c.vmi("nowhere", nowhere)
    c.schedule()
    assert (c.node_of("wanted"), c.node_of("forced"), c.node_of("forbid")) == \
        ("conroe", "haswell", "conroe")
    assert c.message("nowhere") == ("0/2 nodes are available: 2 node(s) didn't match Pod's "
                                    "node affinity/selector.")


def test_evmcs_needs_the_vmx_label(handler: SyncHandler) -> None:
    """KubeVirt's defaulting requires `vmx` of a VMI with Hyper-V evmcs, and so its node."""
    c = Cluster(handler)
    c.node("vmx", labels={FEATURE + "vmx": "true"})
    c.node("plain")
    for seed in range(3):
        evmcs = {"domain": {"features": {"hyperv": {"evmcs": {}}},
                            "resources": {"requests": {"memory": "1Gi"}}}}
        c.vmi(f"e{seed}", evmcs)
    c.schedule()
    assert {c.node_of(f"e{seed}") for seed in range(3)} == {"vmx"}


def test_host_model_needs_the_host_model_label(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("labelled", labels={"host-model-cpu.node.kubevirt.io/Skylake": "true"},
           hostCpuModel="Skylake")
    c.node("obsolete", hostCpuModel="Opteron_G1")  # obsolete: no host-model label
    for seed in range(3):
        host_model = {"domain": {"cpu": {"model": "host-model"},
                                 "resources": {"requests": {"memory": "1Gi"}}}}
        c.vmi(f"h{seed}", host_model)
        c.vmi(f"default{seed}")  # no model: host-model by default, never an obsolete host
    c.schedule()
    assert {c.node_of(f"{p}{s}") for p in ("h", "default") for s in range(3)} == {"labelled"}


def test_the_hyperconverged_workloads_placement_applies_to_every_vmi(
        handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("infra")
    c.node("virt")
    assert c.operator("label", "virt", labels={"nodeType": "virt"}).accepted
    assert c.operator("taint", "virt", add=[{"key": "key", "value": "kubevirt",
                                             "effect": "NoSchedule"}]).accepted
    apply_hco(c.handler, c.state, {"workloads": {"nodePlacement": {
        "nodeSelector": {"nodeType": "virt"},
        "tolerations": [{"key": "key", "operator": "Equal", "value": "kubevirt",
                         "effect": "NoSchedule"}]}}})
    for name in ("a", "b", "c"):
        c.vmi(name)
    c.schedule()
    assert {c.node_of(n) for n in ("a", "b", "c")} == {"virt"}


def test_operator_labels_survive_the_agent_registering_again(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("n1", labels={MODEL + "Haswell": "true"})
    assert c.operator("label", "n1", labels={"disk": "ssd"}).sequences
    c.node("n1", labels={MODEL + "Skylake": "true"})  # re-registers with other discovery
    node = c.state.node("n1")
    assert node is not None
    labels = node.all_labels
    assert labels["disk"] == "ssd" and MODEL + "Skylake" in labels
    assert MODEL + "Haswell" not in labels
    assert labels["kubernetes.io/hostname"] == "n1"


def test_label_and_taint_follow_kubectl(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("n1")
    assert c.operator("label", "n1", labels={"disk": "ssd"}).sequences
    again = c.operator("label", "n1", labels={"disk": "ssd"})
    assert again.accepted and not again.sequences  # not labeled: nothing changed
    refused = c.operator("label", "n1", labels={"disk": "hdd"})
    assert (refused.accepted, refused.reason) == (
        False, "'disk' already has a value (ssd), and --overwrite is false")
    assert c.operator("label", "n1", labels={"disk": "hdd"}, overwrite=True).sequences
    bad = c.operator("label", "n1", labels={"-bad": "x"})
    assert (bad.accepted, bad.field) == (False, "-bad")
    assert c.operator("label", "n1", remove=["disk"]).sequences
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert c.operator("taint", "n1", add=[taint]).sequences
    twice = c.operator("taint", "n1", add=[taint])
    assert (twice.accepted, twice.reason) == (
        False, "node n1 already has k taint(s) with same effect(s) and --overwrite is false")
    missing = c.operator("taint", "n1", remove=[{"key": "k", "effect": "NoExecute"}])
    assert (missing.accepted, missing.reason) == (False, 'taint "k:NoExecute" not found')
    unknown = c.operator("cordon", "n9")
    assert (unknown.accepted, unknown.reason) == (False, 'nodes "n9" not found')


def test_tie_break_is_seeded_and_deterministic(handler: SyncHandler) -> None:
    c = Cluster(handler)
    for i in range(4):
        c.node(f"n{i}")
    c.vmi("v")

    def pick(seed: int) -> object:
        [command] = Scheduler(seed=seed).resync(c.state)
        return command.manifest

    assert all(pick(seed) == pick(seed) for seed in range(8))  # no clock, no chance
    assert len({str(pick(seed)) for seed in range(8)}) > 1  # the seed decides the tie


def pod_affinity(kind: str, app: str) -> dict[str, Any]:
    return {"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname",
         "labelSelector": {"matchLabels": {"app": app}}}]}}}


def test_pod_anti_affinity_spreads_a_group_across_nodes(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("n1")
    c.node("n2")
    for name in ("r1", "r2", "r3"):
        c.vmi(name, pod_affinity("podAntiAffinity", "web"), labels={"app": "web"})
    c.schedule()
    assert {c.node_of("r1"), c.node_of("r2")} == {"n1", "n2"}
    assert c.message("r3") == ("0/2 nodes are available: 2 node(s) didn't satisfy existing "
                               "pods anti-affinity rules.")


def test_pod_affinity_follows_its_peer(handler: SyncHandler) -> None:
    c = Cluster(handler)
    for i in range(3):
        c.node(f"n{i}")
    c.vmi("db", labels={"app": "db"})
    c.schedule()
    c.vmi("cache", pod_affinity("podAffinity", "db"))
    c.vmi("orphan", pod_affinity("podAffinity", "nothing"))
    c.schedule()
    assert c.node_of("cache") == c.node_of("db")
    assert c.message("orphan") == ("0/3 nodes are available: 3 node(s) didn't match pod "
                                   "affinity rules.")


def test_topology_spread_keeps_the_skew(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.node("a1", labels={"zone": "a"})
    c.node("a2", labels={"zone": "a"})
    c.node("b1", labels={"zone": "b"})
    c.node("bare")
    spread = {"topologySpreadConstraints": [{
        "maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}}}]}
    for i in range(4):
        c.vmi(f"w{i}", spread, labels={"app": "web"})
    c.schedule()
    zones = sorted(c.state.node(c.node_of(f"w{i}")).all_labels["zone"]  # type: ignore[union-attr]
                   for i in range(4))
    assert zones == ["a", "a", "b", "b"]
    assert c.operator("cordon", "b1").accepted
    c.vmi("w4", spread, labels={"app": "web"})
    c.schedule()
    assert c.state.node(c.node_of("w4")).all_labels["zone"] == "a"  # type: ignore[union-attr]
    c.vmi("w5", spread, labels={"app": "web"})
    c.schedule()
    assert c.message("w5") == ("0/4 nodes are available: 1 node(s) didn't match pod topology "
                               "spread constraints (missing required label), 1 node(s) were "
                               "unschedulable, 2 node(s) didn't match pod topology spread "
                               "constraints.")


def test_the_least_allocated_node_wins(handler: SyncHandler) -> None:
    for seed in range(4):
        c = Cluster(handler, seed=seed)
        c.node(f"busy{seed}")
        c.vmi(f"first{seed}", {"nodeSelector": {"kubernetes.io/hostname": f"busy{seed}"}})
        c.schedule()
        c.node(f"idle{seed}")
        c.vmi(f"next{seed}")
        c.schedule()
        assert c.node_of(f"next{seed}") == f"idle{seed}"


def test_a_batch_of_changes_decides_the_waiting_vmis_once_per_state(
        handler: SyncHandler) -> None:
    """Every node's change (or every freed VMI) in one batch is shown on one state: the
    waiting VMIs are decided for the first, not again for each of the rest (at 10,000 VMs a
    thousand failed VMIs made a thousand passes over thousands of waiting VMIs). Any change
    of the read model since makes the next such event decide them all again."""
    c = Cluster(handler)
    c.node("n1", memory="1Gi")
    c.vmi("big", {"domain": {"resources": {"requests": {"memory": "4Gi"}}}})
    assert [cmd.verb for cmd in c.schedule()] == ["unschedulable"]
    registered = c.run(Command(id=str(uuid.uuid4()), actor="system:node:n2", kind="Node",
                               verb="register", name="n2", manifest=node_info("n2")))
    [(_, event), *_] = registered.events
    [placed] = c.scheduler.on_event(c.state, event)
    assert (placed.verb, placed.manifest) == ("schedule", {"node": "n2"})
    assert c.scheduler.on_event(c.state, event) == []  # the same state: decided already
    assert c.operator("cordon", "n2").accepted  # folded: the read model changed
    [again] = c.scheduler.on_event(c.state, event)
    assert again.verb == "unschedulable"

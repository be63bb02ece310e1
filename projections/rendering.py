"""Rendering read models in the API's shape: what a query names, and any one view (what
`watch` and `history` show)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from events.api.resources import ClusterTuning
from events.language.query import Query
from projections import eviction_metrics, vm_metrics
from projections.cluster import (
    ClusterState,
    outdated_launcher,
    render_node,
    render_vm,
    render_vmi,
)
from projections.hco import ALERTS_QUERY, HCO_KINDS, METRICS_QUERY, answer, cluster_tuning
from projections.hco import render_view as render_hco_view
from projections.instancetype import INSTANCETYPE_KINDS, ControllerRevisionView, InstancetypeView
from projections.instancetype import of_kind as instancetype_objects
from projections.instancetype import render as render_instancetype
from projections.migration import MigrationView, render_migration
from projections.replicaset import PresetView, ReplicaSetView, render_preset, render_replica_set
from projections.views import NodeView, View, VirtualMachineInstanceView, VirtualMachineView


def render(state: ClusterState, query: Query) -> list[dict[str, Any]]:
    """The objects a query names, in KubeVirt's JSON shape, sorted by namespace and name."""
    out: list[dict[str, Any]] = []
    match query.kind:
        case "VirtualMachine":
            for vm in state.vms():
                meta = vm.metadata
                if _matches(query, meta.namespace, meta.name):
                    out.append(render_vm(vm, state.vmi(meta.namespace, meta.name)))
        case "VirtualMachineInstance":
            for vmi in state.vmis():
                meta = vmi.metadata
                if _matches(query, meta.namespace, meta.name) and (
                        not query.node or vmi.node == query.node):
                    out.append(render_vmi(vmi, outdated=outdated_launcher(state, vmi)))
        case "VirtualMachineInstanceMigration":
            for migration in state.migrations():
                meta = migration.metadata
                if _matches(query, meta.namespace, meta.name):
                    out.append(migration_object(state, migration))
        case "Node":
            tuning = cluster_tuning(state)
            for node in state.nodes():
                if not query.name or node.name == query.name:
                    out.append(node_object(state, node, tuning))
        case kind if kind in HCO_KINDS:
            out = answer(state, kind, query.name, datetime.now(UTC))
        case "VirtualMachineInstanceReplicaSet":
            out = [replica_set_object(state, rs) for rs in state.replica_sets()
                   if _matches(query, rs.metadata.namespace, rs.metadata.name)]
        case "VirtualMachineInstancePreset":
            out = [render_preset(p) for p in state.presets()
                   if _matches(query, p.metadata.namespace, p.metadata.name)]
        case kind if kind in INSTANCETYPE_KINDS:
            out = [render_instancetype(view) for view in
                   instancetype_objects(state.views.values(), kind)
                   if _matches(query, view.metadata.namespace, view.metadata.name)]
        case kind if kind == METRICS_QUERY:
            [hco] = answer(state, kind, query.name, datetime.now(UTC))
            return [{"text": hco["text"] + vm_metrics.exposition(state).decode()
                     + eviction_metrics.exposition(state).decode()}]
        case kind if kind == ALERTS_QUERY:
            return answer(state, kind, query.name, datetime.now(UTC))
    return sorted(out, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))


def node_object(state: ClusterState, node: NodeView,
                tuning: ClusterTuning | None = None) -> dict[str, Any]:
    """A Node with what its VMIs hold, counted as the scheduler counts it (with the cluster's
    tuning, which a caller rendering many nodes works out once)."""
    usage = state.node_usage(node.name, emulation=node.emulation,
                             tuning=tuning or cluster_tuning(state))
    return render_node(node, usage)


def replica_set_object(state: ClusterState, rs: ReplicaSetView) -> dict[str, Any]:
    """A replica set with the status its VMIs give it."""
    return render_replica_set(rs, state.replicas(rs.metadata.namespace, rs.metadata.name))


def migration_object(state: ClusterState, migration: MigrationView) -> dict[str, Any]:
    """A migration with its VMI's migrationState, when the VMI's last migration is this."""
    vmi = state.vmi(migration.metadata.namespace, migration.vmi_name)
    return render_migration(migration, vmi.migration if vmi is not None else None)


def render_view(state: ClusterState, view: View) -> dict[str, Any] | None:
    """Any one view in its API shape (what `watch` and `history` show); None once deleted."""
    if not view.exists:
        return None
    match view:
        case VirtualMachineView():
            meta = view.metadata
            return render_vm(view, state.vmi(meta.namespace, meta.name))
        case VirtualMachineInstanceView():
            return render_vmi(view, outdated=outdated_launcher(state, view))
        case NodeView():
            return node_object(state, view)
        case MigrationView():
            return migration_object(state, view)
        case InstancetypeView() | ControllerRevisionView():
            return render_instancetype(view)
        case ReplicaSetView():
            return replica_set_object(state, view)
        case PresetView():
            return render_preset(view)
    return render_hco_view(state, view)


def _matches(query: Query, namespace: str, name: str) -> bool:
    return (not query.namespace or query.namespace == namespace) and (
        not query.name or query.name == name)

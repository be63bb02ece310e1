"""Rendering read models in the API's shape: what a query names, and any one view (what
`watch` and `history` show)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from events.api.kinds import kind_named
from events.api.node import NODE
from events.api.resources import ClusterTuning
from events.language.query import Query
from events.language.subjects import split_aggregate_id
from projections import eviction_metrics, vm_metrics
from projections.cluster import (
    ClusterState,
    outdated_launcher,
    render_node,
    render_vm,
    render_vmi,
)
from projections.hco import ALERTS_QUERY, METRICS_QUERY, answer, cluster_tuning
from projections.hco import render_view as render_hco_view
from projections.kinds.hco import HCO_TOKENS
from projections.kinds.migration import MigrationView, render_migration
from projections.kinds.replicaset import (
    ReplicaSetView,
    render_replica_set,
)
from projections.kinds.vm import NodeView, VirtualMachineInstanceView, VirtualMachineView
from projections.views import View


def render(state: ClusterState, query: Query) -> list[dict[str, Any]]:
    """The objects a query names, in KubeVirt's JSON shape, sorted by namespace and name:
    every view of the kind's token that matches, rendered as `render_view` renders it."""
    declared = kind_named(query.kind)
    if query.kind == METRICS_QUERY:
        [hco] = answer(state, query.kind, query.name, datetime.now(UTC))
        return [{"text": hco["text"] + vm_metrics.exposition(state).decode()
                 + eviction_metrics.exposition(state).decode()}]
    if query.kind == ALERTS_QUERY:
        return answer(state, query.kind, query.name, datetime.now(UTC))
    if declared is None:
        return []
    if declared.token in HCO_TOKENS:  # one of each for the cluster, whatever namespace asked
        out = [o for o in answer(state, query.kind, query.name, datetime.now(UTC))
               if query.namespace in ("", o["metadata"].get("namespace", ""))]
    elif query.kind == NODE.kind:  # the cluster's tuning worked out once for every node
        tuning = cluster_tuning(state)
        out = [node_object(state, node, tuning) for node in state.nodes()
               if not query.name or node.name == query.name]
    else:
        out = [rendered for view in state.of_token(declared.token)
               if _wanted(query, view) and (rendered := render_view(state, view)) is not None]
    return sorted(out, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))


def _wanted(query: Query, view: View) -> bool:
    """Whether a view of the query's kind is one it names (a node agent's query names its
    node's VMIs only)."""
    if query.namespace or query.name:
        _, namespace, name = split_aggregate_id(view.id)
        if query.namespace not in ("", namespace) or query.name not in ("", name):
            return False
    return not query.node or not isinstance(view, VirtualMachineInstanceView) \
        or view.node == query.node


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
        case ReplicaSetView():
            return replica_set_object(state, view)
    return view.render() or render_hco_view(state, view)

"""The migration controller: takes each migration from Pending to its target, within the
limits, and fails the ones whose ground is gone.

| migration                                 | when                              | command   |
|-------------------------------------------|-----------------------------------|-----------|
| unfinished                                | its VMI is gone, finished, or not | fail      |
|                                           | the instance it was made for; its |           |
|                                           | source or target node NotReady    |           |
| Pending (by priority: evacuation, user,   | a slot free in the cluster and    | admit     |
| workload update; then oldest first)       | out of the source node            |           |
| Scheduling                                | a node but the source fits        | schedule- |
|                                           |                                   | target    |
| Scheduling                                | none fits (message changed)       | target-   |
|                                           |                                   | unschedul.|

Level-triggered: every pass looks at all migrations (there are few), so a restart between
noticing and acting acts on the next pass. The admit handler checks the limits again on
the log's state, so a pass that saw stale counts cannot over-admit.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from controlplane.clusterconfig import ClusterConfig
from controlplane.controllers import derived_command
from controlplane.controllers.scheduler import workload_placement
from controlplane.defaults import SCHEDULER_TIE_BREAK_SEED
from controlplane.scheduling import decide
from controlplane.scheduling.facts import Demand, demand_of
from controlplane.scheduling.ledger import Ledger
from events.api.migration import KIND
from events.api.scheduling import LABEL_HOSTNAME, NodeSelectorRequirement, NodeSelectorTerm
from events.language.codec import Event
from events.language.kinds.migration import MIGRATION_KIND, PRIORITIES
from events.language.kinds.nodes import NODE_KIND
from events.language.kinds.vm import VMI_KIND
from events.language.messages import Command
from events.language.subjects import split_aggregate_id
from projections.cluster import ClusterState
from projections.hco import cluster_tuning
from projections.kinds.hco import HCO_TOKENS
from projections.kinds.migration import MigrationView

NAME = "migration"


def away_from(demand: Demand, node: str) -> Demand:
    """The VMI's demand with the source node excluded, as KubeVirt keeps the target pod off
    the node the VMI runs on."""
    term = NodeSelectorTerm(match_expressions=[NodeSelectorRequirement(
        key=LABEL_HOSTNAME, operator="NotIn", values=[node])])
    return dataclasses.replace(demand, required_terms=(*demand.required_terms, (term,)))


class MigrationController:
    name = NAME

    def __init__(self, seed: int = SCHEDULER_TIE_BREAK_SEED) -> None:
        self.seed = seed

    def on_event(self, state: ClusterState, event: Event) -> list[Command]:
        kind = split_aggregate_id(event.originator_id)[0]
        if kind in (MIGRATION_KIND, VMI_KIND, NODE_KIND) or kind in HCO_TOKENS:
            return self.resync(state)
        return []

    def resync(self, state: ClusterState) -> list[Command]:
        every = list(state.migrations())
        if not every:
            return []
        commands = self._failures(state, every)
        failing = {c.name for c in commands}
        live = [m for m in every if m.metadata.name not in failing]
        return [*commands, *self._admissions(state, live), *self._targets(state, live)]

    @staticmethod
    def _command(m: MigrationView, verb: str, *state: object,
                 manifest: dict[str, object] | None = None) -> Command:
        return derived_command(NAME, KIND, verb, m.metadata.namespace, m.metadata.name,
                               m.version, *state, manifest=manifest,
                               correlation_id=m.correlation_id)

    def _failures(self, state: ClusterState, every: list[MigrationView]) -> list[Command]:
        out: list[Command] = []
        for m in every:
            if m.finished:
                continue
            why = _lost_ground(state, m)
            if why:
                out.append(self._command(m, "fail", manifest={"reason": why}))
        return out

    def _admissions(self, state: ClusterState, every: list[MigrationView]) -> list[Command]:
        config = ClusterConfig.of_state(state).migrations
        running = [m for m in every if m.running]
        outbound = Counter(m.source_node for m in running)
        # The id names the migrations' state: a refusal on stale counts is tried again
        # once any migration changes.
        generation = max((m.last_sequence for m in every), default=0)
        out: list[Command] = []
        pending = sorted((m for m in every if m.phase == "Pending"),
                         key=lambda m: (PRIORITIES.index(m.priority), m.created_at, m.id))
        for m in pending:
            if len(running) + len(out) >= config.parallel_per_cluster:
                break
            if outbound[m.source_node] >= config.parallel_outbound_per_node:
                continue
            outbound[m.source_node] += 1
            out.append(self._command(m, "admit", generation))
        return out

    def _targets(self, state: ClusterState, every: list[MigrationView]) -> list[Command]:
        scheduling = [m for m in every if m.phase == "Scheduling"]
        if not scheduling:
            return []
        tuning = cluster_tuning(state)
        placement = workload_placement(state)
        ledger = Ledger.of(state.nodes(), state.vmis(), tuning)
        out: list[Command] = []
        for m in scheduling:
            vmi = state.vmi(m.metadata.namespace, m.vmi_name)
            if vmi is None or vmi.spec is None:
                continue  # `_failures` fails it
            demand = away_from(demand_of(vmi, vmi.spec, placement, tuning), m.source_node)
            decided = decide(demand, ledger, self.seed)
            if decided.node is not None:
                out.append(self._command(m, "schedule-target",
                                         manifest={"node": decided.node}))
            elif decided.message != m.unschedulable_message:
                out.append(self._command(m, "target-unschedulable", decided.message,
                                         manifest={"message": decided.message}))
        return out


def _lost_ground(state: ClusterState, m: MigrationView) -> str:
    """Why the migration cannot go on, or ''."""
    vmi = state.vmi(m.metadata.namespace, m.vmi_name)
    if vmi is None or vmi.uid != m.vmi_uid or not vmi.active:
        return "the VMI is gone"
    if vmi.deletion_requested_at is not None:
        return "the VMI is being deleted"
    if m.phase == "Pending" and vmi.node != m.source_node:
        return "the VMI is no longer on the source node"
    for role, node in (("source", m.source_node), ("target", m.target_node)):
        view = state.node(node) if node else None
        if view is not None and not view.ready:
            return f"the {role} node {node} is NotReady"
    return ""

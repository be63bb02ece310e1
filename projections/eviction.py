"""Eviction as a read model: each VMI's eviction strategy in force, whether a drain can
move it, and how far a node's drain has got (the evacuation controller decides on these;
`virtbus drain` shows them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from events.api import hco_defaults as d
from projections.cluster import ClusterState
from projections.hco import effective_kubevirt
from projections.kinds.vm import VirtualMachineInstanceView
from projections.migratable import not_migratable

EVICTION_STRATEGIES: Final = ("LiveMigrate", "LiveMigrateIfPossible", "None", "External")


def eviction_strategy(state: ClusterState, vmi: VirtualMachineInstanceView) -> str:
    """The VMI's own strategy, else the cluster's (the seed's default where none is set)."""
    own = vmi.spec.eviction_strategy if vmi.spec is not None else None
    if own in EVICTION_STRATEGIES:
        return own
    cluster = ((effective_kubevirt(state) or {}).get("spec") or {}).get(
        "configuration", {}).get("evictionStrategy")
    if cluster in EVICTION_STRATEGIES:
        return str(cluster)
    several = sum(1 for _ in state.nodes()) > 1
    return d.EVICTION_STRATEGY_MULTI_WORKER if several else d.EVICTION_STRATEGY_SINGLE_WORKER


def blocked_reason(state: ClusterState, vmi: VirtualMachineInstanceView) -> str:
    """Why a drain cannot evict this VMI ('' if it can): LiveMigrate on a VMI that cannot
    live-migrate."""
    if eviction_strategy(state, vmi) != "LiveMigrate" or vmi.spec is None:
        return ""
    refused = not_migratable(vmi.spec, vmi.metadata.annotations)
    return f"{refused.reason}: {refused.message}" if refused is not None else ""


def migrating(state: ClusterState, vmi: VirtualMachineInstanceView) -> bool:
    """A migration of this VMI instance is under way (pending or in flight)."""
    return any(m.vmi_uid == vmi.uid and not m.finished for m in state.migrations())


@dataclass(frozen=True)
class DrainProgress:
    """What a draining node still holds: every VMI left, which of them migrate now, which
    the drain cannot move (and why); `done` once the drain has ended."""

    node: str
    left: list[str] = field(default_factory=list)
    migrating: list[str] = field(default_factory=list)
    blocked: dict[str, str] = field(default_factory=dict)
    done: bool = False

    def describe(self) -> str:
        if self.done:
            return f"node/{self.node}: nothing left to evict"
        parts = [f"{len(self.left)} VMI(s) left on {self.node}",
                 f"{len(self.migrating)} migrating"]
        parts += [f"blocked: {name} ({why})" for name, why in sorted(self.blocked.items())]
        return ", ".join(parts)


def drain_progress(state: ClusterState, node_name: str) -> DrainProgress:
    node = state.node(node_name)
    if node is None or not node.draining:
        return DrainProgress(node_name, done=True)
    vmis = [v for v in state.vmis_on(node_name)
            if not (eviction_strategy(state, v) == "External" and v.evacuation_node)]
    return DrainProgress(
        node_name,
        left=sorted(f"{v.metadata.namespace}/{v.metadata.name}" for v in vmis),
        migrating=sorted(f"{v.metadata.namespace}/{v.metadata.name}" for v in vmis
                         if migrating(state, v)),
        blocked={f"{v.metadata.namespace}/{v.metadata.name}": why for v in vmis
                 if (why := blocked_reason(state, v))})

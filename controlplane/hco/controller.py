"""The HCO controller: the HyperConverged is the source of truth for every operand CR.

Level-triggered on the HyperConverged, the operands and the node count (eviction strategy
depends on it):

| state                                            | command                             |
|--------------------------------------------------|-------------------------------------|
| no HyperConverged ever                           | HyperConverged create-default       |
| operand missing, or drifted from what HCO derives| operand reconcile (write / revert)  |
| operand whose jsonpatch does not apply           | left as it is; failure on conditions|
| every operand in line, conditions changed        | HyperConverged status (conditions)  |

Whether a write is a revert is decided by the writer on fresh state (was the newest write
out of band?), so the revert is recorded with this controller as its actor.
"""

from __future__ import annotations

from typing import Final

import msgspec

from controlplane.controllers import derived_command
from controlplane.hco import jsonpatch
from controlplane.hco.commands import StatusReport, status_unchanged
from controlplane.hco.conditions import compute_conditions
from controlplane.hco.desired import desired_operands, pending_write
from controlplane.hco.operands import OPERANDS, ClusterInfo
from events.api import hco_defaults as d
from events.api.hco import Condition, HyperConverged
from events.language.codec import Event
from events.language.kinds.hco import (
    HCO_KIND,
    OPERAND_TOKENS,
    JsonPatchFailure,
    hco_id,
    operand_id,
)
from events.language.kinds.nodes import NODE_KIND
from events.language.messages import Command
from projections.cluster import ClusterState
from projections.hco import hyperconverged
from projections.kinds.hco import OperandView

NAME = "hco"
_WATCHED: Final = frozenset({HCO_KIND, NODE_KIND, *OPERAND_TOKENS.values()})
_WRITTEN: Final = [Condition(type="Available", status="True", reason="Written")]
"""An operand's conditions once written: virtbus runs no operand operators to report more."""


class HCOController:
    name = NAME

    def on_event(self, state: ClusterState, event: Event) -> list[Command]:
        if event.originator_id.split(".", 1)[0] not in _WATCHED:
            return []
        return self.reconcile(state, event.correlation_id)

    def resync(self, state: ClusterState) -> list[Command]:
        return self.reconcile(state)

    def reconcile(self, state: ClusterState, correlation_id: str = "") -> list[Command]:
        view = hyperconverged(state)
        if view is None:
            if state.views.get(hco_id()) is None:
                return [derived_command(NAME, d.KIND, "create-default", "", d.DEFAULT_NAME, 0)]
            return []
        hco = HyperConverged(metadata=view.metadata, spec=view.spec)
        cluster = ClusterInfo(highly_available=sum(1 for _ in state.nodes()) > 1)
        desired = desired_operands(hco, cluster=cluster)
        failed = {f.annotation for f in desired.failures}
        writes: list[Command] = []
        versions: list[int] = []
        for op in OPERANDS:
            obj = desired.objects[op.kind]
            current = state.views.get(operand_id(op.kind, op.name(hco)))
            versions.append(current.version if current is not None else 0)
            operand = current if isinstance(current, OperandView) and current.exists else None
            if operand is not None and op.jsonpatch_annotation in failed:
                continue
            if operand is None or pending_write(
                    obj, operand.object, out_of_band=operand.out_of_band) is not None:
                writes.append(derived_command(
                    NAME, op.kind, "reconcile", "", op.name(hco), view.version,
                    versions[-1], manifest=obj, correlation_id=correlation_id))
        if writes:
            return writes
        error = "; ".join(f"{f.annotation}: {f.reason}" for f in desired.failures) or None
        report = StatusReport(
            conditions=compute_conditions(
                operands={op.kind: _WRITTEN for op in OPERANDS},
                tainted=bool(jsonpatch.present(hco.metadata.annotations)),
                reconcile_error=error),
            observed_generation=view.generation,
            patch_failures=[JsonPatchFailure(annotation=f.annotation, reason=f.reason)
                            for f in desired.failures])
        if status_unchanged(view, report):
            return []
        return [derived_command(NAME, d.KIND, "status", "", d.DEFAULT_NAME, view.version,
                                *versions, manifest=msgspec.to_builtins(report),
                                correlation_id=correlation_id)]

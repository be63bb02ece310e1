"""The HyperConverged and its operand CRs, folded from their events: the write side decides
on these views and the read side renders them (`projections.hco`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from events.api.base import ObjectMeta
from events.api.hco import Condition, HyperConvergedSpec
from events.language.codec import Event
from events.language.kinds.hco import (
    HCO_KIND,
    OPERAND_TOKENS,
    HyperConvergedCreated,
    HyperConvergedDeleted,
    HyperConvergedStatusChanged,
    HyperConvergedUpdated,
    JsonPatchFailure,
    OperandApplied,
    OperandDeleted,
    OperandModified,
    OperandReverted,
)
from projections.views import View


class HyperConvergedView(View, tokens=(HCO_KIND,)):
    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.uid = ""
        self.metadata = ObjectMeta()
        self.spec = HyperConvergedSpec()
        self.generation = 0
        self.conditions: list[Condition] = []
        self.observed_generation = 0
        self.system_health_status = ""
        self.patch_failures: list[JsonPatchFailure] = []
        self.unsafe_history: list[tuple[dict[str, int], datetime]] = []
        """Every change of the jsonpatch annotations' operation counts, for the metrics."""

    def mutate(self, event: Event) -> None:
        match event:
            case HyperConvergedCreated(uid=uid, metadata=meta, spec=spec, unsafe_modifications=u):
                self.exists, self.uid, self.metadata, self.spec = True, uid, meta, spec
                self.created_at, self.generation = event.timestamp, 1
                self.conditions, self.observed_generation, self.patch_failures = [], 0, []
                self._unsafe(u, event.timestamp)
            case HyperConvergedUpdated(metadata=meta, spec=spec, generation=gen,
                                       unsafe_modifications=u):
                self.metadata, self.spec, self.generation = meta, spec, gen
                self._unsafe(u, event.timestamp)
            case HyperConvergedStatusChanged(conditions=conditions, observed_generation=gen,
                                             system_health_status=health,
                                             patch_failures=failures):
                self.conditions, self.observed_generation = conditions, gen
                self.system_health_status, self.patch_failures = health, failures
            case HyperConvergedDeleted():
                self.exists = False
                self._unsafe({}, event.timestamp)

    def _unsafe(self, counts: dict[str, int], at: datetime) -> None:
        if not self.unsafe_history or self.unsafe_history[-1][0] != counts:
            self.unsafe_history = [*self.unsafe_history, (counts, at)]


class OperandView(View, tokens=OPERAND_TOKENS.values()):
    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.kind = ""
        self.object: dict[str, Any] = {}
        self.out_of_band = False
        """The newest write was not HCO's: the controller is to revert what drifted."""
        self.reverts: list[tuple[str, datetime]] = []
        """(component name, when) of every revert, for the metrics."""

    def mutate(self, event: Event) -> None:
        match event:
            case OperandApplied(kind=kind, object=obj):
                if not self.exists:
                    self.created_at = event.timestamp
                self.exists, self.kind, self.object, self.out_of_band = True, kind, obj, False
            case OperandModified(object=obj):
                self.object, self.out_of_band = obj, True
            case OperandReverted(object=obj, component=component):
                self.object, self.out_of_band = obj, False
                self.reverts = [*self.reverts, (component, event.timestamp)]
            case OperandDeleted():
                self.exists, self.out_of_band = False, False


HCO_TOKENS: Final = frozenset({HCO_KIND, *OPERAND_TOKENS.values()})
"""The aggregate-id tokens of the HyperConverged and its operands: a change to any of them
may change the cluster's configuration."""

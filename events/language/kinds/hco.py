"""Events of the HyperConverged and of the operand CRs HCO derives from it.

| aggregate                               | events                                        |
|-----------------------------------------|-----------------------------------------------|
| `hco._.kubevirt-hyperconverged`         | HyperConvergedCreated / Updated / Deleted,    |
|                                         | HyperConvergedStatusChanged                   |
| `<operand token>._.<CR name>`, e.g.     | OperandApplied (HCO wrote what it derived),   |
| `kubevirt._.kubevirt-kubevirt-hyper...` | OperandModified (anyone else wrote it),       |
|                                         | OperandReverted (HCO undid that), OperandDeleted |

Each event's `actor` says who wrote: the user for an out-of-band write, the HCO controller
for a derived write or a revert, so an operand's history shows both.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from events.api import hco_defaults as d
from events.api.base import ObjectMeta
from events.api.hco import HYPERCONVERGED, OPERANDS, Condition, HyperConvergedSpec
from events.language.codec import Event, event_type
from events.language.subjects import aggregate_id

HCO_KIND: Final = HYPERCONVERGED.token
OPERAND_TOKENS: Final = {kind: declared.token for kind, declared in OPERANDS.items()}
"""Operand kind -> the aggregate-id token of its CR (`kubevirt`, `cdi`, ...)."""


def hco_id(name: str = d.DEFAULT_NAME) -> str:
    """The HyperConverged's aggregate id: one per cluster, cluster-scoped."""
    return aggregate_id(HCO_KIND, "", name)


def operand_id(kind: str, name: str) -> str:
    return aggregate_id(OPERAND_TOKENS[kind], "", name)


class JsonPatchFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A jsonpatch annotation that was not applied, and why."""

    annotation: str
    reason: str


@event_type("HyperConvergedCreated")
class HyperConvergedCreated(Event, frozen=True, kw_only=True):
    """`unsafe_modifications`: operations per jsonpatch annotation, as the metric counts them."""

    uid: str
    metadata: ObjectMeta
    spec: HyperConvergedSpec
    unsafe_modifications: dict[str, int] = {}


@event_type("HyperConvergedUpdated")
class HyperConvergedUpdated(Event, frozen=True, kw_only=True):
    metadata: ObjectMeta
    spec: HyperConvergedSpec
    generation: int
    unsafe_modifications: dict[str, int] = {}


@event_type("HyperConvergedDeleted")
class HyperConvergedDeleted(Event, frozen=True, kw_only=True):
    """`removed_workloads`: the VMs deleted with it (uninstallStrategy RemoveWorkloads)."""

    removed_workloads: list[str] = []


@event_type("HyperConvergedStatusChanged")
class HyperConvergedStatusChanged(Event, frozen=True, kw_only=True):
    conditions: list[Condition]
    observed_generation: int
    system_health_status: str
    patch_failures: list[JsonPatchFailure] = []


@event_type("OperandApplied")
class OperandApplied(Event, frozen=True, kw_only=True):
    """HCO wrote the operand as derived from the HyperConverged (jsonpatch applied);
    `drift` lists what changed against the previous object."""

    kind: str
    object: dict[str, Any]
    drift: list[str] = []


@event_type("OperandModified")
class OperandModified(Event, frozen=True, kw_only=True):
    """Someone other than HCO wrote the operand (an out-of-band modification)."""

    kind: str
    object: dict[str, Any]


@event_type("OperandReverted")
class OperandReverted(Event, frozen=True, kw_only=True):
    """HCO overwrote an out-of-band modification; `component` is the CR's name, as the
    `component_name` label of kubevirt_hco_out_of_band_modifications_total."""

    kind: str
    component: str
    drift: list[str]
    object: dict[str, Any]


@event_type("OperandDeleted")
class OperandDeleted(Event, frozen=True, kw_only=True):
    kind: str

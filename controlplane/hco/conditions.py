"""The HyperConverged status conditions, computed from what the operator observed.

HCO aggregates its operands' conditions into its own; README.md, "Conditions", has the table.
`TaintedConfiguration` is only reported (True) while a jsonpatch annotation is set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Literal

from events.api.hco import Condition

AVAILABLE: Final = "Available"
PROGRESSING: Final = "Progressing"
DEGRADED: Final = "Degraded"
UPGRADEABLE: Final = "Upgradeable"
RECONCILE_COMPLETE: Final = "ReconcileComplete"
TAINTED_CONFIGURATION: Final = "TaintedConfiguration"

INIT: Final = "Init"
INIT_MESSAGE: Final = "Initializing HyperConverged cluster"
COMPLETED: Final = "ReconcileCompleted"
COMPLETED_MESSAGE: Final = "Reconcile completed successfully"
FAILED: Final = "ReconcileFailed"
UPGRADING: Final = "HCOUpgrading"
TAINTED_REASON: Final = "UnsupportedFeatureAnnotation"
TAINTED_MESSAGE: Final = "Unsupported feature was activated via an HCO annotation"

Status = Literal["True", "False", "Unknown"]


def _cond(type_: str, status: Status, reason: str, message: str) -> Condition:
    return Condition(type=type_, status=status, reason=reason, message=message)


def compute_conditions(
    *,
    operands: Mapping[str, Sequence[Condition]] | None,
    tainted: bool = False,
    reconcile_error: str | None = None,
    upgrading_to: str | None = None,
) -> list[Condition]:
    """The conditions for the HyperConverged status; `operands` maps kind to its conditions."""
    if operands is None:
        result = [
            _cond(RECONCILE_COMPLETE, "Unknown", INIT, INIT_MESSAGE),
            _cond(AVAILABLE, "False", INIT, INIT_MESSAGE),
            _cond(PROGRESSING, "True", INIT, INIT_MESSAGE),
            _cond(DEGRADED, "False", INIT, INIT_MESSAGE),
            _cond(UPGRADEABLE, "Unknown", INIT, INIT_MESSAGE),
        ]
    else:
        result = [_reconcile_complete(reconcile_error), *_aggregate(operands, upgrading_to)]
    if tainted:
        result.append(_cond(TAINTED_CONFIGURATION, "True", TAINTED_REASON, TAINTED_MESSAGE))
    return result


def _reconcile_complete(error: str | None) -> Condition:
    if error is None:
        return _cond(RECONCILE_COMPLETE, "True", COMPLETED, COMPLETED_MESSAGE)
    return _cond(RECONCILE_COMPLETE, "False", FAILED, f"Error while reconciling: {error}")


def _aggregate(
    operands: Mapping[str, Sequence[Condition]], upgrading_to: str | None
) -> list[Condition]:
    found: dict[str, Condition] = {}

    def first(type_: str, status: Status, reason: str, message: str) -> None:
        found.setdefault(type_, _cond(type_, status, reason, message))

    if upgrading_to is not None:
        message = f"HCO is now upgrading to version {upgrading_to}"
        first(PROGRESSING, "True", UPGRADING, message)
        first(UPGRADEABLE, "False", UPGRADING, message)
    for kind, conditions in operands.items():
        if not conditions:
            message = f"{kind} resource has no conditions"
            first(AVAILABLE, "False", f"{kind}Conditions", message)
            first(PROGRESSING, "True", f"{kind}Conditions", message)
            first(UPGRADEABLE, "False", f"{kind}Conditions", message)
        for c in conditions:
            if c.type == AVAILABLE and c.status == "False":
                first(
                    AVAILABLE,
                    "False",
                    f"{kind}NotAvailable",
                    f"{kind} is not available: {c.message}",
                )
            elif c.type == PROGRESSING and c.status == "True":
                message = f"{kind} is progressing: {c.message}"
                first(PROGRESSING, "True", f"{kind}Progressing", message)
                first(UPGRADEABLE, "False", f"{kind}Progressing", message)
            elif c.type == DEGRADED and c.status == "True":
                first(DEGRADED, "True", f"{kind}Degraded", f"{kind} is degraded: {c.message}")
    first(AVAILABLE, "True", COMPLETED, COMPLETED_MESSAGE)
    first(PROGRESSING, "False", COMPLETED, COMPLETED_MESSAGE)
    first(DEGRADED, "False", COMPLETED, COMPLETED_MESSAGE)
    first(UPGRADEABLE, "True", COMPLETED, COMPLETED_MESSAGE)
    return [found[t] for t in (AVAILABLE, PROGRESSING, DEGRADED, UPGRADEABLE)]


def merge_conditions(
    previous: Sequence[Condition], computed: Sequence[Condition], *, now: str
) -> list[Condition]:
    """`computed` with lastTransitionTime kept where the status did not change, else `now`."""
    before = {c.type: c for c in previous}
    merged = []
    for c in computed:
        old = before.get(c.type)
        since = old.last_transition_time if old is not None and old.status == c.status else now
        merged.append(
            Condition(
                type=c.type,
                status=c.status,
                reason=c.reason,
                message=c.message,
                last_transition_time=since,
                observed_generation=c.observed_generation,
            )
        )
    return merged


def system_health(conditions: Sequence[Condition]) -> Literal["healthy", "warning", "error"]:
    """HCO's `status.systemHealthStatus`: error when degraded, warning when not settled."""
    status = {c.type: c.status for c in conditions}
    if status.get(DEGRADED) == "True":
        return "error"
    settled = (
        status.get(RECONCILE_COMPLETE) == "True"
        and status.get(AVAILABLE) == "True"
        and status.get(PROGRESSING) == "False"
        and status.get(UPGRADEABLE) == "True"
    )
    return "healthy" if settled else "warning"

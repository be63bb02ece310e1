"""HyperConverged conditions aggregated from operand conditions, as HCO reports them."""

from __future__ import annotations

from controlplane.hco.conditions import compute_conditions, merge_conditions, system_health
from events.api.hco import Condition


def by_type(conditions: list[Condition]) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in conditions}


HEALTHY = [
    Condition(type="Available", status="True", reason="Ok"),
    Condition(type="Progressing", status="False", reason="Ok"),
    Condition(type="Degraded", status="False", reason="Ok"),
]


def test_init_before_first_reconcile() -> None:
    conditions = compute_conditions(operands=None)
    assert by_type(conditions) == {
        "ReconcileComplete": ("Unknown", "Init"),
        "Available": ("False", "Init"),
        "Progressing": ("True", "Init"),
        "Degraded": ("False", "Init"),
        "Upgradeable": ("Unknown", "Init"),
    }
    assert system_health(conditions) == "warning"


def test_all_operands_healthy() -> None:
    conditions = compute_conditions(operands={"KubeVirt": HEALTHY, "CDI": HEALTHY})
    assert by_type(conditions) == {
        "ReconcileComplete": ("True", "ReconcileCompleted"),
        "Available": ("True", "ReconcileCompleted"),
        "Progressing": ("False", "ReconcileCompleted"),
        "Degraded": ("False", "ReconcileCompleted"),
        "Upgradeable": ("True", "ReconcileCompleted"),
    }
    assert system_health(conditions) == "healthy"


def test_operand_not_available_progressing_degraded() -> None:
    kubevirt = [
        Condition(type="Available", status="False", reason="x", message="deploying"),
        Condition(type="Progressing", status="True", reason="x", message="rolling"),
        Condition(type="Degraded", status="True", reason="x", message="crashloop"),
    ]
    conditions = compute_conditions(operands={"KubeVirt": kubevirt, "CDI": HEALTHY})
    assert by_type(conditions)["Available"] == ("False", "KubeVirtNotAvailable")
    assert by_type(conditions)["Progressing"] == ("True", "KubeVirtProgressing")
    assert by_type(conditions)["Upgradeable"] == ("False", "KubeVirtProgressing")
    assert by_type(conditions)["Degraded"] == ("True", "KubeVirtDegraded")
    available = next(c for c in conditions if c.type == "Available")
    assert available.message == "KubeVirt is not available: deploying"
    assert system_health(conditions) == "error"


def test_operand_without_conditions() -> None:
    conditions = compute_conditions(operands={"SSP": []})
    assert by_type(conditions)["Available"] == ("False", "SSPConditions")
    assert by_type(conditions)["Progressing"] == ("True", "SSPConditions")
    assert by_type(conditions)["Upgradeable"] == ("False", "SSPConditions")


def test_reconcile_failure_and_upgrade() -> None:
    conditions = compute_conditions(
        operands={"KubeVirt": HEALTHY}, reconcile_error="patch failed", upgrading_to="1.14.0"
    )
    complete = next(c for c in conditions if c.type == "ReconcileComplete")
    assert (complete.status, complete.reason) == ("False", "ReconcileFailed")
    assert complete.message == "Error while reconciling: patch failed"
    assert by_type(conditions)["Progressing"] == ("True", "HCOUpgrading")
    assert by_type(conditions)["Upgradeable"] == ("False", "HCOUpgrading")


def test_merge_keeps_transition_time_while_status_holds() -> None:
    first = merge_conditions([], compute_conditions(operands=None), now="T1")
    assert {c.last_transition_time for c in first} == {"T1"}
    second = merge_conditions(first, compute_conditions(operands={"KubeVirt": HEALTHY}), now="T2")
    times = {c.type: c.last_transition_time for c in second}
    assert times["Degraded"] == "T1"  # False -> False
    assert times["Available"] == "T2"  # False -> True

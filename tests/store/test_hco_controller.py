"""The HCO controller on the real store: once every operand is written and the status
recorded, it has nothing to send, not even a status command the handler would drop."""

from __future__ import annotations

from controlplane.hco.controller import HCOController
from projections.cluster import ClusterState
from projections.hco import hyperconverged
from tests.store.helpers import SyncHandler, run_accepted


def test_a_settled_hyperconverged_sends_nothing(handler: SyncHandler) -> None:
    state = ClusterState()
    controller = HCOController()
    sent: list[str] = []
    for _round in range(4):  # create-default, the operands, the status, then nothing
        commands = controller.reconcile(state)
        if not commands:
            break
        for command in commands:
            sent.append(command.verb)
            assert run_accepted(handler, state, command).events, command  # never a no-op
    assert sent == ["create-default", *["reconcile"] * 4, "status"]
    view = hyperconverged(state)
    assert view is not None and view.conditions
    assert controller.reconcile(state) == []

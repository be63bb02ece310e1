"""The HCO controller on the real store: once every operand is written and the status
recorded, it has nothing to send, not even a status command the handler would drop; an
operand write decided before the HyperConverged's delete and recorded after it brings no
operand back."""

from __future__ import annotations

import uuid

from controlplane.hco.controller import HCOController
from events.api import hco_defaults as d
from events.language.messages import Command
from projections.cluster import ClusterState
from projections.hco import hyperconverged
from projections.kinds.hco import OperandView
from tests.store.helpers import SyncHandler, run, run_accepted


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


def test_an_operand_write_recorded_after_the_delete_brings_nothing_back(
        handler: SyncHandler) -> None:
    state = ClusterState()
    controller = HCOController()
    [create] = controller.reconcile(state)
    run_accepted(handler, state, create)
    writes = controller.reconcile(state)  # decided now, recorded after the delete
    assert {command.verb for command in writes} == {"reconcile"}
    run_accepted(handler, state, Command(id=str(uuid.uuid4()), actor="user:admin",
                                         kind=d.KIND, verb="delete", name=d.DEFAULT_NAME))
    for command in writes:
        result = run(handler, state, command)
        assert result.outcome.accepted and not result.events, result.outcome
    assert hyperconverged(state) is None
    assert not [view for view in state.views.values()
                if isinstance(view, OperandView) and view.exists]

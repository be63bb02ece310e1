"""A small cluster on the real store whose VMIs run and migrate: the scheduler's, the
migration controller's and the evacuation controller's commands executed as the control
loop executes them, and the agents' migration reports sent as the report intake sends them."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from controlplane.drain.controller import EvacuationController
from controlplane.migration.controller import MigrationController
from events.language.messages import Command, DomainObservation, MigrationObservation, node_actor
from projections.cluster import render_vmi
from projections.kinds.migration import MigrationView
from projections.kinds.vm import VirtualMachineInstanceView
from tests.store.helpers import SyncHandler, run
from tests.store.scheduling_helpers import SMALL, Cluster

MIGRATION = "VirtualMachineInstanceMigration"


class MigratingCluster(Cluster):
    def __init__(self, handler: SyncHandler) -> None:
        super().__init__(handler)
        self.migrations = MigrationController()
        self.evacuation = EvacuationController()

    def vmi(self, name: str, spec: dict[str, Any] | None = None,
            labels: dict[str, str] | None = None) -> None:
        """A VMI on the pod network with masquerade, as `virtbus up`'s cluster defaults it (HCO's
        binding): KubeVirt's own default, bridge, migrates no VMI."""
        spec = {**SMALL, **(spec or {})}
        if "networks" not in spec:
            devices = {"interfaces": [{"name": "default", "masquerade": {}}],
                       **spec["domain"].get("devices", {})}
            spec = {**spec, "domain": {**spec["domain"], "devices": devices},
                    "networks": [{"name": "default", "pod": {}}]}
        super().vmi(name, spec, labels)

    def running(self, name: str, spec: dict[str, Any] | None = None) -> str:
        """A VMI placed and reported Running by its node; the node."""
        self.vmi(name, spec)
        self.schedule()
        view = self.view(name)
        self.run(Command(id=str(uuid.uuid4()), actor=node_actor(view.node),
                         kind="VirtualMachineInstance", verb="observe", namespace="default",
                         name=name, manifest=msgspec.to_builtins(DomainObservation(
                             namespace="default", name=name, uid=view.uid,
                             phase="Running"))))
        return view.node

    def view(self, name: str) -> VirtualMachineInstanceView:
        found = self.state.vmi("default", name)
        assert found is not None
        return found

    def user(self, kind: str, verb: str, name: str) -> Any:
        """A user's command; its outcome, whatever it is."""
        return run(self.handler, self.state, Command(
            id=str(uuid.uuid4()), actor="user:erin", kind=kind, verb=verb,
            namespace="default", name=name)).outcome

    def settle(self) -> list[Command]:
        """The controllers' passes (the scheduler's too), each command executed, until a pass
        proposes nothing new; every command proposed."""
        seen: set[str] = set()
        proposed: list[Command] = []
        for _ in range(20):
            fresh = [c for c in (*self.migrations.resync(self.state),
                                 *self.evacuation.resync(self.state),
                                 *self.scheduler.resync(self.state)) if c.id not in seen]
            if not fresh:
                return proposed
            for command in fresh:
                seen.add(command.id)
                proposed.append(command)
                run(self.handler, self.state, command)
        raise AssertionError("the controllers did not settle")

    def migration_of(self, vmi: str) -> MigrationView:
        found = [m for m in self.state.migrations() if m.vmi_name == vmi]
        assert found, f"no migration of {vmi}"
        return max(found, key=lambda m: m.version if m.created_at is None else m.created_at)

    def report(self, vmi: str, state: str, *, node: str = "", **fields: Any) -> Any:
        """An agent's migration report (from the node that sends that state, unless
        `node`); its outcome."""
        m = self.migration_of(vmi)
        sender = node or (m.target_node if state == "target-ready" else m.source_node)
        obs = MigrationObservation(namespace="default", name=vmi, vmi_uid=m.vmi_uid,
                                   migration_uid=m.uid, state=state, **fields)  # type: ignore[arg-type]
        return run(self.handler, self.state, Command(
            id=str(uuid.uuid4()), actor=node_actor(sender), kind=MIGRATION, verb="observe",
            namespace="default", name=vmi, manifest=msgspec.to_builtins(obs)))

    def migration_state(self, vmi: str) -> dict[str, Any]:
        state: dict[str, Any] = render_vmi(self.view(vmi))["status"].get("migrationState", {})
        return state

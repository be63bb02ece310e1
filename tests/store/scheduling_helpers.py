"""A small cluster on the real store, driven the way the control loop drives it: nodes
register and are labelled, tainted, cordoned by commands; VMIs are applied; the scheduler's
commands are executed and folded into the read model."""

from __future__ import annotations

import uuid
from typing import Any

from controlplane.controllers.scheduler import Scheduler
from events.language.messages import Command
from projections.cluster import ClusterState, render_vmi
from tests.store.helpers import SyncHandler, node_info, run, run_accepted
from tests.store.test_feature_gates import apply, vmi

SMALL = {"domain": {"resources": {"requests": {"memory": "1Gi"}}}}


class Cluster:
    def __init__(self, handler: SyncHandler, seed: int = 0) -> None:
        self.handler = handler
        self.state = ClusterState()
        self.scheduler = Scheduler(seed=seed)

    def run(self, command: Command) -> Any:
        return run_accepted(self.handler, self.state, command)

    def node(self, name: str, *, labels: dict[str, str] | None = None,
             **allocatable: str) -> None:
        """Register node `name` (8 CPUs, 16Gi, devices) with discovery `labels`."""
        info = node_info(name)
        info["allocatable"] = {**info["allocatable"], **allocatable}
        info["labels"] = labels or {}
        if "hostCpuModel" in allocatable:
            info["hostCpuModel"] = info["allocatable"].pop("hostCpuModel")
        self.run(Command(id=str(uuid.uuid4()), actor=f"system:node:{name}", kind="Node",
                         verb="register", name=name, manifest=info))

    def operator(self, verb: str, node: str, **body: Any) -> Any:
        """An operator's node command; its outcome, whatever it is."""
        return run(self.handler, self.state, Command(
            id=str(uuid.uuid4()), actor="user:erin", kind="Node", verb=verb, name=node,
            manifest=body or None)).outcome

    def vmi(self, name: str, spec: dict[str, Any] | None = None,
            labels: dict[str, str] | None = None) -> None:
        manifest = vmi(name, {**SMALL, **(spec or {})})
        if labels:
            manifest["metadata"]["labels"] = labels
        self.run(apply(manifest))

    def schedule(self) -> list[Command]:
        """One resync of the scheduler, its commands executed; the commands."""
        commands = self.scheduler.resync(self.state)
        for command in commands:
            self.run(command)
        return commands

    def follow(self, command: Command) -> None:
        """`command` executed, then each event it causes shown to the scheduler, one at a
        time and in order, its commands executed in turn: as the control loop goes live."""
        events = list(self.run(command).events)
        while events:
            _, event = events.pop(0)
            for decided in self.scheduler.on_event(self.state, event):
                events += run(self.handler, self.state, decided).events

    def node_of(self, name: str) -> str:
        view = self.state.vmi("default", name)
        assert view is not None
        return view.node

    def pod_scheduled(self, name: str) -> list[dict[str, Any]]:
        view = self.state.vmi("default", name)
        assert view is not None
        return [c for c in render_vmi(view)["status"]["conditions"]
                if c["type"] == "PodScheduled"]

    def message(self, name: str) -> str:
        [condition] = self.pod_scheduled(name)
        assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
        return str(condition["message"])


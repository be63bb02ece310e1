"""Controllers: each looks at the read model and proposes commands; the loop executes them.

A controller is level-triggered: `reconcile` looks at current state, not at the event that
woke it, so a restart (which replays the log and reconciles everything once) converges to
the same actions. Proposed commands carry ids derived from the state they were decided on;
deciding again on the same state yields the same id, which the store refuses to apply twice.
"""

from __future__ import annotations

import uuid
from typing import Protocol

from controlplane.defaults import COMMAND_ACTOR_CONTROLLER
from events.language.codec import Event
from events.language.ids import name_uuid
from events.language.messages import Command
from projections.cluster import ClusterState

_IDS = uuid.UUID("0d3c6f7e-2b1a-5e4d-9c8b-7a6f5e4d3c2b")


def derived_command(controller: str, kind: str, verb: str, namespace: str, name: str,
                    *state: object, manifest: dict[str, object] | None = None,
                    correlation_id: str = "") -> Command:
    """A controller's command whose id is a function of what it was decided on."""
    key = ":".join([controller, kind, verb, namespace, name, *map(str, state)])
    return Command(id=name_uuid(_IDS, key), actor=f"{COMMAND_ACTOR_CONTROLLER}:{controller}",
                   kind=kind, verb=verb, namespace=namespace, name=name, manifest=manifest,
                   correlation_id=correlation_id)


class Controller(Protocol):
    name: str

    def on_event(self, state: ClusterState, event: Event) -> list[Command]:
        """Commands to execute now that `event` is in `state`."""

    def resync(self, state: ClusterState) -> list[Command]:
        """Commands for everything, after a replay."""

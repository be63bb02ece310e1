"""Events of VirtualMachineInstanceReplicaSets.

| aggregate           | events                                                          |
|---------------------|-----------------------------------------------------------------|
| `vmirs.<ns>.<name>` | ReplicaSetApplied, ReplicaSetScaled, ReplicaSetDeleted,         |
|                     | ReplicaSetReplicaFailure / ReplicaSetReplicaFailureCleared      |

Its replicas are VMIs whose `VirtualMachineInstanceCreated` names the replica set
(`replica_set`), appended in the same atomic batch as the decision that wanted them; how many
exist and are ready is read from them, not kept here.
"""

from __future__ import annotations

from typing import Final, Literal

from events.api.base import ObjectMeta
from events.api.replicaset import (
    VIRTUAL_MACHINE_INSTANCE_REPLICA_SET,
    VirtualMachineInstanceReplicaSetSpec,
)
from events.language.codec import Event, event_type

REPLICA_SET_KIND: Final = VIRTUAL_MACHINE_INSTANCE_REPLICA_SET.token
FailureReason = Literal["FailedCreate", "FailedDelete"]


@event_type("ReplicaSetApplied")
class ReplicaSetApplied(Event, frozen=True, kw_only=True):
    """Created or changed; `generation` counts spec changes."""

    uid: str
    metadata: ObjectMeta
    spec: VirtualMachineInstanceReplicaSetSpec
    generation: int


@event_type("ReplicaSetScaled")
class ReplicaSetScaled(Event, frozen=True, kw_only=True):
    """`spec.replicas` set through the scale subresource (`kubectl scale`)."""

    replicas: int
    generation: int


@event_type("ReplicaSetDeleted")
class ReplicaSetDeleted(Event, frozen=True, kw_only=True):
    """Gone; its VMIs are deleted with it (KubeVirt's owner references, foreground)."""


@event_type("ReplicaSetReplicaFailure")
class ReplicaSetReplicaFailure(Event, frozen=True, kw_only=True):
    """A replica could not be created (the ReplicaFailure condition, as KubeVirt's
    `checkFailure` sets it)."""

    reason: FailureReason
    message: str


@event_type("ReplicaSetReplicaFailureCleared")
class ReplicaSetReplicaFailureCleared(Event, frozen=True, kw_only=True):
    """A replica was created again: the ReplicaFailure condition is removed."""

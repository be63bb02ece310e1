"""Events of VirtualMachines and VirtualMachineInstances.

A VM's aggregate id is `vm.<namespace>.<name>`, its VMI's is `vmi.<namespace>.<name>`: the
same name, as in KubeVirt, so deleting and re-creating either continues one history.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from events.api.base import ObjectMeta
from events.api.virtualmachines import VIRTUAL_MACHINE, VIRTUAL_MACHINE_INSTANCE
from events.api.vm import (
    VirtualMachineInstanceNetworkInterface,
    VirtualMachineInstanceSpec,
    VirtualMachineSpec,
)
from events.language.codec import Event, event_type

VM_KIND: Final = VIRTUAL_MACHINE.token
VMI_KIND: Final = VIRTUAL_MACHINE_INSTANCE.token

PAUSED_USER_REQUESTED: Final = "PausedUserRequested"
"""The reason of the Paused condition when a user paused the guest."""
PAUSED_IO_ERROR: Final = "PausedIOError"
"""The reason of the Paused condition when the hypervisor paused the guest on a disk I/O
error (libvirt's paused reason IOERROR), as virt-handler reports it."""
PAUSED_MESSAGES: Final = {
    PAUSED_USER_REQUESTED: "VMI was paused by user",
    PAUSED_IO_ERROR: "VMI was paused, low-level IO error detected",
}
NODE_UNRESPONSIVE: Final = "NodeUnresponsive"
"""The reason of a VMI failed because its node stopped heartbeating (virt-controller's
NodeUnresponsiveReason): the control plane's verdict, not the node's report."""

Phase = Literal["Pending", "Scheduling", "Scheduled", "Running", "Succeeded", "Failed"]
StateChange = Literal["Start", "Stop"]


@event_type("VirtualMachineCreated")
class VirtualMachineCreated(Event, frozen=True, kw_only=True):
    uid: str
    metadata: ObjectMeta
    spec: VirtualMachineSpec


@event_type("VirtualMachineUpdated")
class VirtualMachineUpdated(Event, frozen=True, kw_only=True):
    """A new spec (and labels/annotations); `generation` counts spec changes as in k8s."""

    metadata: ObjectMeta
    spec: VirtualMachineSpec
    generation: int


@event_type("VirtualMachineRunStrategyChanged")
class VirtualMachineRunStrategyChanged(Event, frozen=True, kw_only=True):
    """`virtctl start|stop` on Always/Halted/Once switches the VM to Always or Halted, in the
    form the user wrote: `spec.runStrategy`, or `spec.running: true|false` on a VM that uses
    `running` (KubeVirt's `getRunningPatch`)."""

    run_strategy: str
    generation: int


@event_type("VirtualMachineStateChangeRequested")
class VirtualMachineStateChangeRequested(Event, frozen=True, kw_only=True):
    """A request in status.stateChangeRequests (`start`/`stop` on Manual and RerunOnFailure,
    the VM controller rerunning a failed RerunOnFailure VMI). A Start waits for the next VMI;
    a Stop names the VMI it stops (`uid`). Either clears status.startFailure."""

    action: StateChange
    uid: str = ""


@event_type("VirtualMachineStartRequestDone")
class VirtualMachineStartRequestDone(Event, frozen=True, kw_only=True):
    """The pending Start request was met: a VMI was created for it (KubeVirt trims the
    request once the VMI exists)."""


@event_type("VirtualMachineStartFailed")
class VirtualMachineStartFailed(Event, frozen=True, kw_only=True):
    """VMI `vmi_uid` finished without ever running: status.startFailure, and no new VMI
    before the event's time plus `delay_seconds` (KubeVirt's crash-loop backoff)."""

    vmi_uid: str
    consecutive_fail_count: int
    delay_seconds: int


@event_type("VirtualMachineStartFailureCleared")
class VirtualMachineStartFailureCleared(Event, frozen=True, kw_only=True):
    """A VMI of the VM reached Running, or the run strategy no longer restarts failed VMIs:
    the crash-loop backoff starts over."""


@event_type("VirtualMachineRestartRequested")
class VirtualMachineRestartRequested(Event, frozen=True, kw_only=True):
    """Restart: the VMI is deleted and, the run strategy permitting, created anew."""

    restart_count: int


@event_type("VirtualMachineDeleted")
class VirtualMachineDeleted(Event, frozen=True, kw_only=True):
    pass


@event_type("VirtualMachineInstanceCreated")
class VirtualMachineInstanceCreated(Event, frozen=True, kw_only=True):
    uid: str
    metadata: ObjectMeta
    spec: VirtualMachineInstanceSpec
    owner: str = ""
    """The owning VM's name, or '' for a standalone VMI."""
    restart_count: int = 0
    """The owner's restart count when this VMI was made; a later restart replaces it."""
    replica_set: str = ""
    """The owning VirtualMachineInstanceReplicaSet's name, or ''."""


def _node_name_to_node(v1: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 called the field `node_name`; schema 2 says `node`, as the views do."""
    v2 = dict(v1)
    v2["node"] = v2.pop("node_name")
    return v2


@event_type("VirtualMachineInstanceScheduled")
class VirtualMachineInstanceScheduled(Event, frozen=True, kw_only=True):
    SCHEMA = 2
    UPCASTERS = {1: _node_name_to_node}

    node: str
    launcher_version: str = ""
    """The version of the node's agent that will launch it (older logs: unknown, '')."""


@event_type("VirtualMachineInstanceUnschedulable")
class VirtualMachineInstanceUnschedulable(Event, frozen=True, kw_only=True):
    """No node fits the Pending VMI: its PodScheduled condition is False (Unschedulable)
    with kube-scheduler's `message`. Appended only when the message changes."""

    message: str


@event_type("VirtualMachineInstancePhaseChanged")
class VirtualMachineInstancePhaseChanged(Event, frozen=True, kw_only=True):
    phase: Phase
    reason: str = ""
    message: str = ""


@event_type("VirtualMachineInstanceRelabeled")
class VirtualMachineInstanceRelabeled(Event, frozen=True, kw_only=True):
    """The VMI's labels, as a later apply sets them (KubeVirt lets a VMI's metadata change,
    never its spec)."""

    labels: dict[str, str]


@event_type("VirtualMachineInstanceAdopted")
class VirtualMachineInstanceAdopted(Event, frozen=True, kw_only=True):
    """An orphan VMI the replica set's selector matches is the replica set's now (KubeVirt's
    `AdoptVirtualMachineInstance`: its controller ownerReference set)."""

    replica_set: str


@event_type("VirtualMachineInstanceReleased")
class VirtualMachineInstanceReleased(Event, frozen=True, kw_only=True):
    """The VMI's labels no longer match its replica set's selector: it is an orphan again
    (KubeVirt's `ReleaseVirtualMachineInstance`), and stops counting as a replica."""


@event_type("VirtualMachineInstanceDeletionRequested")
class VirtualMachineInstanceDeletionRequested(Event, frozen=True, kw_only=True):
    grace_period_seconds: int


@event_type("VirtualMachineInstanceDeleted")
class VirtualMachineInstanceDeleted(Event, frozen=True, kw_only=True):
    pass


@event_type("VirtualMachineInstanceNodeAction")
class VirtualMachineInstanceNodeAction(Event, frozen=True, kw_only=True):
    """A request for the node running the VMI: pause, unpause or restart the guest."""

    action: Literal["pause", "unpause", "restart"]


@event_type("VirtualMachineInstancePaused")
class VirtualMachineInstancePaused(Event, frozen=True, kw_only=True):
    """The node confirmed the guest's vCPUs are suspended: the Paused condition is True."""

    reason: str = PAUSED_USER_REQUESTED


@event_type("VirtualMachineInstanceUnpaused")
class VirtualMachineInstanceUnpaused(Event, frozen=True, kw_only=True):
    """The node confirmed the guest runs again: the Paused condition is gone."""


@event_type("VirtualMachineInstanceAgentConnected")
class VirtualMachineInstanceAgentConnected(Event, frozen=True, kw_only=True):
    """The node saw the QEMU guest agent's channel connect (`connected`) or disconnect:
    KubeVirt's `AgentConnected` condition is True while it is connected."""

    connected: bool


@event_type("VirtualMachineInstanceInterfacesReported")
class VirtualMachineInstanceInterfacesReported(Event, frozen=True, kw_only=True):
    """The node's view of the guest's network interfaces changed: `status.interfaces`."""

    interfaces: list[VirtualMachineInstanceNetworkInterface]

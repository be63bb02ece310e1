"""Read models of VirtualMachineInstancePresets and VirtualMachineInstanceReplicaSets,
rendered as KubeVirt shows them. A replica set's `status` is read from its VMIs, which the
caller (`projections.cluster.ClusterState.replicas`) finds."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import msgspec

from events.api.base import ObjectMeta
from events.api.replicaset import (
    PRESET,
    REPLICA_SET,
    VirtualMachineInstancePresetSpec,
    VirtualMachineInstanceReplicaSetSpec,
)
from events.api.scheduling import LabelSelector
from events.api.vm import API_VERSION
from events.language.codec import Event
from events.language.kinds.preset import (
    PRESET_KIND,
    VirtualMachineInstancePresetApplied,
    VirtualMachineInstancePresetDeleted,
)
from events.language.kinds.replicaset import (
    REPLICA_SET_KIND,
    FailureReason,
    ReplicaSetApplied,
    ReplicaSetDeleted,
    ReplicaSetReplicaFailure,
    ReplicaSetReplicaFailureCleared,
    ReplicaSetScaled,
)
from projections.kinds.vm import VirtualMachineInstanceView
from projections.views import View, iso, object_meta

PAUSED_CONDITION: Final = "ReplicaPaused"
FAILURE_CONDITION: Final = "ReplicaFailure"
PAUSED_MESSAGE: Final = "Controller got paused"
"""KubeVirt's `checkPaused` wording."""


class PresetView(View, tokens=(PRESET_KIND,)):
    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.uid = ""
        self.metadata = ObjectMeta()
        self.spec = VirtualMachineInstancePresetSpec()
        self.generation = 0

    def mutate(self, event: Event) -> None:
        match event:
            case VirtualMachineInstancePresetApplied(uid=uid, metadata=meta, spec=spec,
                                                     generation=generation):
                if not self.exists:
                    self.created_at = event.timestamp
                self.exists, self.uid, self.metadata = True, uid, meta
                self.spec, self.generation = spec, generation
            case VirtualMachineInstancePresetDeleted():
                self.exists = False

    def render(self) -> dict[str, Any]:
        return render_preset(self)


class ReplicaFailure(msgspec.Struct, frozen=True, kw_only=True):
    reason: FailureReason
    message: str
    since: datetime


class ReplicaSetView(View, tokens=(REPLICA_SET_KIND,)):
    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.uid = ""
        self.metadata = ObjectMeta()
        self.spec: VirtualMachineInstanceReplicaSetSpec | None = None
        self.generation = 0
        self.paused_at: datetime | None = None
        """When `spec.paused` last became true (the ReplicaPaused condition's time)."""
        self.failure: ReplicaFailure | None = None

    @property
    def paused(self) -> bool:
        return self.spec is not None and self.spec.paused

    def mutate(self, event: Event) -> None:
        match event:
            case ReplicaSetApplied(uid=uid, metadata=meta, spec=spec, generation=generation):
                if not self.exists:
                    self.created_at, self.failure = event.timestamp, None
                if spec.paused and not self.paused:
                    self.paused_at = event.timestamp
                self.exists, self.uid, self.metadata = True, uid, meta
                self.spec, self.generation = spec, generation
            case ReplicaSetScaled(replicas=replicas, generation=generation) if self.spec:
                self.spec = msgspec.structs.replace(self.spec, replicas=replicas)
                self.generation = generation
            case ReplicaSetReplicaFailure(reason=reason, message=message):
                self.failure = ReplicaFailure(reason=reason, message=message,
                                              since=event.timestamp)
            case ReplicaSetReplicaFailureCleared():
                self.failure = None
            case ReplicaSetDeleted():
                self.exists = False


def render_preset(view: PresetView) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": PRESET,
            "metadata": object_meta(view, view.metadata, view.uid, view.generation),
            "spec": msgspec.to_builtins(view.spec)}


def selector_string(selector: LabelSelector) -> str:
    """metav1.LabelSelectorAsSelector(selector).String(): requirements sorted by key, each
    as Kubernetes prints it (`status.labelSelector`, what the scale subresource gives)."""
    parts = [(key, f"{key}={value}") for key, value in selector.match_labels.items()]
    for req in selector.match_expressions:
        values = ",".join(sorted(set(req.values)))
        match req.operator:
            case "In":
                parts.append((req.key, f"{req.key} in ({values})"))
            case "NotIn":
                parts.append((req.key, f"{req.key} notin ({values})"))
            case "Exists":
                parts.append((req.key, req.key))
            case "DoesNotExist":
                parts.append((req.key, f"!{req.key}"))
    return ",".join(text for _, text in sorted(parts, key=lambda part: part[0]))


def ready(vmi: VirtualMachineInstanceView) -> bool:
    """KubeVirt's `filterReadyVMIs`: the VMI's Ready condition is True."""
    return vmi.phase == "Running"


def render_replica_set(view: ReplicaSetView,
                       replicas: Sequence[VirtualMachineInstanceView]) -> dict[str, Any]:
    """`replicas`: its active VMIs (not final, not being deleted), as KubeVirt counts them."""
    conditions: list[dict[str, Any]] = []
    if view.paused:
        conditions.append({"type": PAUSED_CONDITION, "status": "True", "reason": "Paused",
                           "message": PAUSED_MESSAGE, "lastProbeTime": None,
                           "lastTransitionTime": iso(view.paused_at)})
    if view.failure is not None:
        conditions.append({"type": FAILURE_CONDITION, "status": "True",
                           "reason": view.failure.reason, "message": view.failure.message,
                           "lastProbeTime": None,
                           "lastTransitionTime": iso(view.failure.since)})
    status: dict[str, Any] = {}
    if view.spec is not None:
        status["labelSelector"] = selector_string(view.spec.selector)
    if replicas:
        status["replicas"] = len(replicas)
    if ready_count := sum(1 for vmi in replicas if ready(vmi)):
        status["readyReplicas"] = ready_count
    if conditions:
        status["conditions"] = conditions
    return {"apiVersion": API_VERSION, "kind": REPLICA_SET,
            "metadata": object_meta(view, view.metadata, view.uid, view.generation),
            "spec": msgspec.to_builtins(view.spec) if view.spec is not None else {},
            "status": status}

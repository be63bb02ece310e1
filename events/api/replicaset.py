"""kubevirt.io/v1 VirtualMachineInstancePreset and VirtualMachineInstanceReplicaSet, as users
submit them (KubeVirt's `types.go`)."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

from events.api.base import ApiStruct, ObjectMeta
from events.api.domain import DomainSpec
from events.api.errors import InvalidSpec
from events.api.kinds import AGE, NAME, Column, Kind, at_path, declare
from events.api.scheduling import LabelSelector, selector_matches
from events.api.validation import validate_vmi_spec
from events.api.vm import API_VERSION, VirtualMachineInstanceTemplateSpec

PRESET: Final = "VirtualMachineInstancePreset"
REPLICA_SET: Final = "VirtualMachineInstanceReplicaSet"
DEFAULT_REPLICAS: Final = 1
"""KubeVirt's `calcDiff`: a replica set that leaves `replicas` out wants one."""

Replicas = Annotated[int, msgspec.Meta(ge=0)]
"""Go's *int32 of a count: never negative."""


class ScaleBody(msgspec.Struct, frozen=True, kw_only=True):
    """`scale`: the new `spec.replicas`."""

    replicas: Replicas


class VirtualMachineInstancePresetSpec(ApiStruct):
    """The domain fields a preset fills in on the VMIs its selector matches."""

    selector: LabelSelector = msgspec.field(default_factory=LabelSelector)
    domain: DomainSpec | None = None


class VirtualMachineInstancePreset(ApiStruct):
    metadata: ObjectMeta
    spec: VirtualMachineInstancePresetSpec
    api_version: str = API_VERSION
    kind: Literal["VirtualMachineInstancePreset"] = "VirtualMachineInstancePreset"


class VirtualMachineInstanceReplicaSetSpec(ApiStruct):
    selector: LabelSelector
    template: VirtualMachineInstanceTemplateSpec
    replicas: Replicas | None = None
    paused: bool = False

    @property
    def wanted(self) -> int:
        return DEFAULT_REPLICAS if self.replicas is None else self.replicas


class VirtualMachineInstanceReplicaSet(ApiStruct):
    metadata: ObjectMeta
    spec: VirtualMachineInstanceReplicaSetSpec
    api_version: str = API_VERSION
    kind: Literal["VirtualMachineInstanceReplicaSet"] = "VirtualMachineInstanceReplicaSet"
    status: dict[str, Any] | None = None


def check_selector(selector: LabelSelector, path: str) -> None:
    """LabelSelectorAsSelector's rules: In / NotIn need values, Exists / DoesNotExist none."""
    for i, req in enumerate(selector.match_expressions):
        field = f"{path}.matchExpressions[{i}].values"
        if req.operator in ("In", "NotIn") and not req.values:
            raise InvalidSpec(field, f"must be non-empty for operator {req.operator}")
        if req.operator in ("Exists", "DoesNotExist") and req.values:
            raise InvalidSpec(field, f"must be empty for operator {req.operator}")


def validate_preset(preset: VirtualMachineInstancePreset) -> None:
    check_selector(preset.spec.selector, "spec.selector")


def validate_replica_set(rs: VirtualMachineInstanceReplicaSet) -> None:
    """KubeVirt's `ValidateVMIRSSpec`: a template that is a valid VMI spec, and a selector
    that selects the template's labels."""
    spec = rs.spec
    validate_vmi_spec(spec.template.spec, "spec.template.spec")
    check_selector(spec.selector, "spec.selector")
    if not selector_matches(spec.selector, spec.template.metadata.labels):
        raise InvalidSpec("spec.selector", "selector does not match labels.")


def _desired(obj: dict[str, Any]) -> int:
    replicas = at_path(obj, ".spec.replicas")
    return DEFAULT_REPLICAS if replicas is None else int(replicas)


_GROUP: Final = API_VERSION.partition("/")[0]
VIRTUAL_MACHINE_INSTANCE_PRESET: Final = declare(Kind(
    kind=PRESET, group=_GROUP, versions=("v1",), plural="virtualmachineinstancepresets",
    token="vmipreset", short_names=("vmipreset", "vmipresets"), categories=("all",),
    manifest=VirtualMachineInstancePreset, validate=validate_preset))
VIRTUAL_MACHINE_INSTANCE_REPLICA_SET: Final = declare(Kind(
    kind=REPLICA_SET, group=_GROUP, versions=("v1",),
    plural="virtualmachineinstancereplicasets", token="vmirs", short_names=("vmirs", "vmirss"),
    categories=("all",), manifest=VirtualMachineInstanceReplicaSet,
    validate=validate_replica_set, subresources=("status", "scale"),
    columns=(NAME,
             Column("DESIRED", ".spec.replicas", "integer", value=_desired),
             Column("CURRENT", ".status.replicas", "integer",
                    value=lambda o: at_path(o, ".status.replicas") or 0),
             Column("READY", ".status.readyReplicas", "integer",
                    value=lambda o: at_path(o, ".status.readyReplicas") or 0),
             AGE)))

"""Events of instancetypes, preferences and the ControllerRevisions that pin them to VMs.

| aggregate                                  | events                                       |
|--------------------------------------------|----------------------------------------------|
| `vminstancetype.<ns>.<name>`,              | VirtualMachineInstancetypeApplied / Deleted  |
| `vmclusterinstancetype._.<name>`           |                                              |
| `vmpreference.<ns>.<name>`,                | VirtualMachinePreferenceApplied / Deleted    |
| `vmclusterpreference._.<name>`             |                                              |
| `controllerrevision.<ns>.<name>`           | ControllerRevisionCreated / Deleted          |
| `vm.<ns>.<name>`                           | VirtualMachineRevisionsPinned                |

A revision holds the whole object as it was when its VM first started, so later edits or a
deletion of the instancetype change nothing the VM runs with until the VM is moved on.
"""

from __future__ import annotations

from typing import Any, Final

from events.api.base import ObjectMeta
from events.api.instancetype import (
    CONTROLLER_REVISION,
    VIRTUAL_MACHINE_CLUSTER_INSTANCETYPE,
    VIRTUAL_MACHINE_CLUSTER_PREFERENCE,
    VIRTUAL_MACHINE_INSTANCETYPE,
    VIRTUAL_MACHINE_PREFERENCE,
    VirtualMachineInstancetypeSpec,
    VirtualMachinePreferenceSpec,
)
from events.language.codec import Event, event_type

KIND_TOKENS: Final = {declared.kind: declared.token for declared in (
    VIRTUAL_MACHINE_INSTANCETYPE, VIRTUAL_MACHINE_CLUSTER_INSTANCETYPE,
    VIRTUAL_MACHINE_PREFERENCE, VIRTUAL_MACHINE_CLUSTER_PREFERENCE)}
"""Each kind's aggregate-id token."""
REVISION_KIND: Final = CONTROLLER_REVISION.kind
REVISION_TOKEN: Final = CONTROLLER_REVISION.token


@event_type("VirtualMachineInstancetypeApplied")
class VirtualMachineInstancetypeApplied(Event, frozen=True, kw_only=True):
    """Created or changed; `kind` says namespaced or cluster-wide, `uid` stays for the
    object's life, `generation` counts spec changes."""

    kind: str
    api_version: str
    uid: str
    metadata: ObjectMeta
    spec: VirtualMachineInstancetypeSpec
    generation: int


@event_type("VirtualMachineInstancetypeDeleted")
class VirtualMachineInstancetypeDeleted(Event, frozen=True, kw_only=True):
    pass


@event_type("VirtualMachinePreferenceApplied")
class VirtualMachinePreferenceApplied(Event, frozen=True, kw_only=True):
    kind: str
    api_version: str
    uid: str
    metadata: ObjectMeta
    spec: VirtualMachinePreferenceSpec
    generation: int


@event_type("VirtualMachinePreferenceDeleted")
class VirtualMachinePreferenceDeleted(Event, frozen=True, kw_only=True):
    pass


@event_type("ControllerRevisionCreated")
class ControllerRevisionCreated(Event, frozen=True, kw_only=True):
    """A snapshot of an instancetype or preference for one VM (`owner`, `owner_uid`):
    `data` is the object in its API shape, as KubeVirt stores it in `data`."""

    metadata: ObjectMeta
    owner: str
    owner_uid: str
    data: dict[str, Any]


@event_type("ControllerRevisionDeleted")
class ControllerRevisionDeleted(Event, frozen=True, kw_only=True):
    """Its VM is gone (KubeVirt's owner reference: garbage collected with the VM)."""


@event_type("VirtualMachineRevisionsPinned")
class VirtualMachineRevisionsPinned(Event, frozen=True, kw_only=True):
    """The VM's matchers now name the revisions captured for it ('' leaves one as it is);
    a spec change, so `generation` moves as Kubernetes moves it."""

    instancetype_revision: str = ""
    preference_revision: str = ""
    generation: int

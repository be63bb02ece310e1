"""Which instancetype and preference a VM runs with: admission of a VM that names them, and
the revisions captured when it first starts (KubeVirt's `pkg/instancetype/revision`).

A matcher with a `revisionName` is pinned: the VM expands with that revision's copy of the
object, whatever became of the object since. Without one, the VM expands with the object as
it is now, and its next start captures a revision named as the seed shows KubeVirt naming
them, `<vm>-<object>-<object uid>-<object generation>`, and pins the matcher to it.
"""

from __future__ import annotations

from typing import Final

import msgspec

from controlplane.decision import Decision, Rejected
from controlplane.instancetype.expand import (
    Expanded,
    InstancetypeConflict,
    expand,
    not_carried,
)
from controlplane.instancetype.infer import FAILURE_POLICIES, with_inferred_matchers
from controlplane.instancetype.mutate import with_preferred_defaults
from controlplane.instancetype.requirements import check_requirements, check_spread
from events.api.base import ObjectMeta
from events.api.errors import InvalidSpec
from events.api.instancetype import (
    CLUSTER_INSTANCETYPE,
    CLUSTER_PREFERENCE,
    INSTANCETYPE,
    PREFERENCE,
    VirtualMachineInstancetypeSpec,
    VirtualMachinePreferenceSpec,
)
from events.api.validation import validate_vmi_spec
from events.api.vm import Matcher, VirtualMachine
from events.language.kinds.instancetype import (
    KIND_TOKENS,
    REVISION_TOKEN,
    ControllerRevisionCreated,
    ControllerRevisionDeleted,
    VirtualMachineRevisionsPinned,
)
from events.language.subjects import aggregate_id
from projections.cluster import ClusterState
from projections.kinds.instancetype import ControllerRevisionView, InstancetypeView
from projections.kinds.vm import VirtualMachineView

TEMPLATE_PATH: Final = "spec.template.spec"


class Family(msgspec.Struct, frozen=True):
    """Instancetypes or preferences: the matcher's field and Go type name, its kinds as a
    matcher may spell
    them (KubeVirt compares lower-cased, singular or plural; none means the cluster kind),
    the VMI annotation naming what was applied, and the spec type."""

    field: str
    matcher_type: str
    namespaced: str
    cluster: str
    annotations: tuple[str, str]
    spec_type: type[VirtualMachineInstancetypeSpec] | type[VirtualMachinePreferenceSpec]

    def kind(self, matcher: Matcher) -> str:
        spelled = matcher.kind.lower()
        for kind in (self.namespaced, self.cluster):
            if spelled in (kind.lower(), f"{kind.lower()}s"):
                return kind
        if not spelled:
            return self.cluster
        raise InvalidSpec(f"spec.{self.field}.kind",
                          f"must be {self.namespaced} or {self.cluster}, not {matcher.kind!r}")

    def source_id(self, matcher: Matcher, namespace: str) -> str:
        kind = self.kind(matcher)
        return aggregate_id(KIND_TOKENS[kind], namespace if kind == self.namespaced else "",
                            matcher.name)

    def annotation(self, matcher: Matcher) -> tuple[str, str]:
        namespaced, cluster = self.annotations
        return (namespaced if self.kind(matcher) == self.namespaced else cluster), matcher.name


INSTANCETYPES: Final = Family("instancetype", "InstancetypeMatcher", INSTANCETYPE,
                              CLUSTER_INSTANCETYPE,
                              ("kubevirt.io/instancetype-name",
                               "kubevirt.io/cluster-instancetype-name"),
                              VirtualMachineInstancetypeSpec)
PREFERENCES: Final = Family("preference", "PreferenceMatcher", PREFERENCE,
                            CLUSTER_PREFERENCE,
                            ("kubevirt.io/preference-name", "kubevirt.io/cluster-preference-name"),
                            VirtualMachinePreferenceSpec)


def revision_id(namespace: str, name: str) -> str:
    return aggregate_id(REVISION_TOKEN, namespace, name)


def revision_name(vm: str, source: InstancetypeView) -> str:
    return f"{vm}-{source.metadata.name}-{source.uid}-{source.generation}"


# --- admission -----------------------------------------------------------------------------


def admitted_vm(d: Decision, submitted: VirtualMachine,
                stored: VirtualMachineView) -> VirtualMachine:
    """The VM to record for `submitted`: its inferred matchers resolved, the pins the stored
    VM has kept, and admitted on its expansion (`admit_vm`)."""
    if submitted.spec.instancetype is None and submitted.spec.preference is None:
        return submitted  # decoding admitted it as it stands
    for family in (INSTANCETYPES, PREFERENCES):
        _check_matcher(family, getattr(submitted.spec, family.field),
                       getattr(stored.spec, family.field) if stored.exists else None)
    new = _with_kept_pins(with_inferred_matchers(submitted), stored)
    preference = _find(d, PREFERENCES, new.spec.preference, new.metadata.namespace)
    if isinstance(preference, VirtualMachinePreferenceSpec):
        new = with_preferred_defaults(new, preference)
    admit_vm(d, new)
    return new


def _check_matcher(family: Family, matcher: Matcher | None, old: Matcher | None) -> None:
    """KubeVirt's matcher rules (its VM mutating webhook), worded as it words them."""
    if matcher is None:
        return
    at, noun = f"spec.{family.field}", family.matcher_type
    if not matcher.name and not matcher.infer_from_volume:
        raise InvalidSpec(at, f"Either Name or InferFromVolume should be provided within the "
                              f"{noun}")
    if matcher.infer_from_volume:
        for field, value in (("name", matcher.name), ("kind", matcher.kind)):
            if value:
                raise InvalidSpec(f"{at}.{field}", f"{field.capitalize()} already set, should "
                                                   f"be cleared before setting inferFromVolume")
    policy = matcher.infer_from_volume_failure_policy
    if policy is not None and policy not in FAILURE_POLICIES:
        raise InvalidSpec(f"{at}.inferFromVolumeFailurePolicy",
                          f"Invalid value '{policy}' for InferFromVolumeFailurePolicy")
    if old is not None and old.revision_name and old.name != matcher.name \
            and old.revision_name == matcher.revision_name:
        raise InvalidSpec(f"{at}.revisionName",
                          "the Matcher Name has been updated without updating the RevisionName")


def _with_kept_pins(new: VirtualMachine, stored: VirtualMachineView) -> VirtualMachine:
    """`new` with the revisions the stored VM is pinned to, where `new` leaves `revisionName`
    out and names the same object; `revisionName: ""` unpins."""
    old = stored.spec if stored.exists else None
    spec = new.spec
    for family in (INSTANCETYPES, PREFERENCES):
        matcher: Matcher | None = getattr(spec, family.field)
        if matcher is None:
            continue
        kept = getattr(old, family.field) if old is not None else None
        revision = matcher.revision_name
        if revision is None and kept is not None and (kept.name, family.kind(kept)) == (
                matcher.name, family.kind(matcher)):
            revision = kept.revision_name
        spec = msgspec.structs.replace(spec, **{family.field: msgspec.structs.replace(
            matcher, revision_name=revision or None)})
    return msgspec.structs.replace(new, spec=spec)


def admit_vm(d: Decision, vm: VirtualMachine) -> None:
    """KubeVirt's VM admission with an instancetype or preference: the template expanded with
    what they name (or the revisions it is pinned to) must have no conflict and be a valid
    VMI spec. One that cannot be found is no refusal, as in KubeVirt: the template is then
    checked as it stands, and the VM will not start until it exists."""
    spec, namespace = vm.spec, vm.metadata.namespace
    instancetype, preference = (_find(d, family, getattr(spec, family.field), namespace)
                                for family in (INSTANCETYPES, PREFERENCES))
    if isinstance(instancetype, VirtualMachineInstancetypeSpec) and (
            missing := not_carried(instancetype)):
        raise InvalidSpec("spec.instancetype",
                          f"the instancetype sets {', '.join(missing)}, which a virtbus VMI "
                          "cannot hold yet")
    template = spec.template
    if instancetype is None and preference is None:
        validate_vmi_spec(template.spec, TEMPLATE_PATH)
        return
    check_spread(_as_instancetype(instancetype), _as_preference(preference))
    expanded = expand(template.spec, template.metadata, _as_instancetype(instancetype),
                      _as_preference(preference), TEMPLATE_PATH)
    check_requirements(_as_instancetype(instancetype), _as_preference(preference),
                       expanded.spec, TEMPLATE_PATH)
    validate_vmi_spec(expanded.spec, TEMPLATE_PATH)


AnySpec = VirtualMachineInstancetypeSpec | VirtualMachinePreferenceSpec


def _find(d: Decision, family: Family, matcher: Matcher | None,
          namespace: str) -> AnySpec | None:
    """The spec of the revision the matcher is pinned to, else of the object it names; None
    if that is absent."""
    if matcher is None:
        return None
    if matcher.revision_name:
        revision = d.load(revision_id(namespace, matcher.revision_name), ControllerRevisionView)
        return _revision_spec(revision.state, family) if revision.exists else None
    source = d.load(family.source_id(matcher, namespace), InstancetypeView)
    return source.state.spec if source.exists else None


def _revision_spec(revision: ControllerRevisionView, family: Family) -> AnySpec:
    """The spec a revision holds, which must be of the family the matcher asks for."""
    kind = revision.data.get("kind")
    if kind not in (family.namespaced, family.cluster):
        raise InvalidSpec(f"spec.{family.field}.revisionName",
                          f"ControllerRevision {revision.metadata.name} holds a {kind}, not a "
                          f"{family.namespaced} or {family.cluster}")
    return msgspec.convert(revision.data.get("spec", {}), family.spec_type)


def _as_instancetype(spec: object) -> VirtualMachineInstancetypeSpec | None:
    return spec if isinstance(spec, VirtualMachineInstancetypeSpec) else None


def _as_preference(spec: object) -> VirtualMachinePreferenceSpec | None:
    return spec if isinstance(spec, VirtualMachinePreferenceSpec) else None


# --- start: capture, pin, expand ------------------------------------------------------------


def expand_for_start(d: Decision, vm_id: str) -> Expanded | None:
    """The VM's template expanded for its new VMI, with the revisions it starts with captured
    and pinned first (in the same decision); None when it names neither an instancetype nor a
    preference. Refused when what it names is gone and was never captured, or conflicts."""
    vm = d.load(vm_id, VirtualMachineView)
    state = vm.state
    if state.spec is None or (state.spec.instancetype is None and state.spec.preference is None):
        return None
    namespace = state.metadata.namespace
    specs: list[AnySpec | None] = []
    pins: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for family in (INSTANCETYPES, PREFERENCES):
        matcher: Matcher | None = getattr(state.spec, family.field)
        if matcher is None:
            specs.append(None)
            continue
        key, value = family.annotation(matcher)
        annotations[key] = value
        if matcher.revision_name:
            revision = d.load(revision_id(namespace, matcher.revision_name),
                              ControllerRevisionView)
            if not revision.exists:
                raise Rejected(f'controllerrevisions.apps "{matcher.revision_name}" not found',
                               f"spec.{family.field}.revisionName")
            specs.append(_revision_spec(revision.state, family))
            continue
        source = d.load(family.source_id(matcher, namespace), InstancetypeView)
        if not source.exists:
            raise Rejected(f'{family.kind(matcher).lower()}s.instancetype.kubevirt.io '
                           f'"{matcher.name}" not found', f"spec.{family.field}.name")
        pins[family.field] = _capture(d, state, source.state)
        specs.append(source.state.spec)
    template = state.spec.template
    meta = msgspec.structs.replace(template.metadata,
                                   annotations={**template.metadata.annotations, **annotations})
    try:
        expanded = expand(template.spec, meta, _as_instancetype(specs[0]),
                          _as_preference(specs[1]), "spec")
    except InstancetypeConflict as conflict:
        raise Rejected(f"VMI conflicts with instancetype spec in fields: "
                       f"[{', '.join(conflict.paths)}]", conflict.field) from None
    validate_vmi_spec(expanded.spec, "spec")  # what was pinned now may differ from admission's
    if pins:
        d.trigger(vm, VirtualMachineRevisionsPinned,
                  instancetype_revision=pins.get(INSTANCETYPES.field, ""),
                  preference_revision=pins.get(PREFERENCES.field, ""),
                  generation=state.generation + 1)
    return expanded


def _capture(d: Decision, vm: VirtualMachineView, source: InstancetypeView) -> str:
    """A revision of `source` for `vm`: recorded now, or the one recorded before from the
    same object at the same generation (KubeVirt's `storeControllerRevision`)."""
    name = revision_name(vm.metadata.name, source)
    revision = d.load(revision_id(vm.metadata.namespace, name), ControllerRevisionView)
    data = source.api_object()
    if revision.exists:
        if revision.state.data.get("spec") != data["spec"]:
            raise Rejected(f"found existing ControllerRevision with unexpected data: {name}")
        return name
    d.trigger(revision, ControllerRevisionCreated,
              metadata=ObjectMeta(name=name, namespace=vm.metadata.namespace),
              owner=vm.metadata.name, owner_uid=vm.uid, data=data)
    return name


def delete_revisions(d: Decision, vm: VirtualMachineView) -> None:
    """Every revision the VM owns goes with it (KubeVirt's owner reference)."""
    for revision in d.all_existing(REVISION_TOKEN, ControllerRevisionView):
        if revision.state.owner_uid == vm.uid and revision.state.owner == vm.metadata.name:
            d.trigger(revision, ControllerRevisionDeleted)


def referenced_versions(state: ClusterState, vm: VirtualMachineView) -> list[int]:
    """The versions of the objects (or revisions) the VM names: a controller's command for
    the VM is a new one once any of them changes (one refused while an instancetype was
    missing is asked again when it appears)."""
    if vm.spec is None:
        return []
    namespace, versions = vm.metadata.namespace, []
    for family in (INSTANCETYPES, PREFERENCES):
        matcher: Matcher | None = getattr(vm.spec, family.field)
        if matcher is None:
            continue
        try:
            agg = revision_id(namespace, matcher.revision_name) if matcher.revision_name \
                else family.source_id(matcher, namespace)
        except InvalidSpec:
            continue
        view = state.views.get(agg)
        versions.append(view.version if view is not None else 0)
    return versions

"""Who may do what, where: an authorization policy in Kubernetes RBAC's own shape.

An operator writes Roles, ClusterRoles, RoleBindings and ClusterRoleBindings
(`rbac.authorization.k8s.io/v1`, YAML, one document each) naming NATS users as `User`
subjects, so the same file can later be applied to a Kubernetes cluster. KubeVirt's default
ClusterRoles (`kubevirt.io:admin`, `:edit`, `:view`) and `cluster-admin` exist without being
written, as they do on a cluster with KubeVirt installed.

A command is the request `kubectl`/`virtctl` would make for it (`REQUESTS`): `virtbus apply`
of a VirtualMachine is a `patch` of `virtualmachines` in `kubevirt.io` (server-side apply),
`virtbus start` an `update` of `virtualmachines/start` in `subresources.kubevirt.io`. Reads
are `get` / `list` / `watch`. It lives in `events` because the writer (command intake) and
the readers (read service) both decide with it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final, Literal

import msgspec
import yaml

from events.api import kinds
from events.api.errors import InvalidSpec

RBAC_API_VERSION: Final = "rbac.authorization.k8s.io/v1"
WILDCARD: Final = "*"
KUBEVIRT_GROUP: Final = "kubevirt.io"
INSTANCETYPE_GROUP: Final = "instancetype.kubevirt.io"
SUBRESOURCES_GROUP: Final = "subresources.kubevirt.io"
DEFAULT_NAMESPACE: Final = "default"


class Request(msgspec.Struct, frozen=True):
    """One access, as the Kubernetes API server's authorizer sees it."""

    verb: str
    group: str
    resource: str
    namespace: str = ""
    """'' for a cluster-scoped object or a request across every namespace."""

    def __str__(self) -> str:
        where = (f' in the namespace "{self.namespace}"' if self.namespace
                 else " at the cluster scope")
        return (f'cannot {self.verb} resource "{self.resource}" in API group '
                f'"{self.group}"{where}')


class PathRequest(msgspec.Struct, frozen=True):
    """An access to a path that is no resource (`/metrics`), granted by `nonResourceURLs`
    rules, which only a ClusterRoleBinding grants (they have no namespace)."""

    verb: str
    path: str

    def __str__(self) -> str:
        return f'cannot {self.verb} path "{self.path}"'


class PolicyRule(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    verbs: list[str]
    api_groups: list[str] = []
    resources: list[str] = []
    resource_names: list[str] = []
    non_resource_urls: list[str] = msgspec.field(default_factory=list, name="nonResourceURLs")

    def grants(self, request: Request | PathRequest) -> bool:
        if not _matches(self.verbs, request.verb):
            return False
        if isinstance(request, PathRequest):
            return any(_url_matches(url, request.path) for url in self.non_resource_urls)
        return (_matches(self.api_groups, request.group)
                and _matches(self.resources, request.resource) and not self.resource_names)


class Metadata(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    namespace: str = ""


class RoleRef(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    kind: Literal["Role", "ClusterRole"]
    name: str
    api_group: str = "rbac.authorization.k8s.io"


class Subject(msgspec.Struct, frozen=True, kw_only=True):
    kind: Literal["User"]
    name: str


class _Rules(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    api_version: str = RBAC_API_VERSION
    metadata: Metadata
    rules: list[PolicyRule] = []


class Role(_Rules, frozen=True, kw_only=True, tag_field="kind", tag="Role"):
    """Rules in its own namespace."""


class ClusterRole(_Rules, frozen=True, kw_only=True, tag_field="kind", tag="ClusterRole"):
    """Rules everywhere it is bound, in one namespace (RoleBinding) or all (ClusterRoleBinding)."""


class _Binding(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    api_version: str = RBAC_API_VERSION
    metadata: Metadata
    role_ref: RoleRef
    subjects: list[Subject] = []


class RoleBinding(_Binding, frozen=True, kw_only=True, tag_field="kind", tag="RoleBinding"):
    """Grants a role's rules in the binding's namespace only."""


class ClusterRoleBinding(_Binding, frozen=True, kw_only=True, tag_field="kind",
                         tag="ClusterRoleBinding"):
    """Grants a ClusterRole's rules in every namespace and at the cluster scope."""


RbacObject = Role | ClusterRole | RoleBinding | ClusterRoleBinding

_ALL_VERBS: Final = ["get", "list", "watch", "create", "update", "patch", "delete",
                     "deletecollection"]
_KUBEVIRT_RESOURCES: Final = ["virtualmachines", "virtualmachineinstances",
                              "virtualmachineinstancepresets",
                              "virtualmachineinstancereplicasets",
                              "virtualmachineinstancemigrations"]
_INSTANCETYPE_RESOURCES: Final = ["virtualmachineinstancetypes", "virtualmachinepreferences"]
_VM_ACTIONS: Final = ["virtualmachines/start", "virtualmachines/stop",
                      "virtualmachines/restart", "virtualmachines/migrate"]
_VMI_ACTIONS: Final = ["virtualmachineinstances/pause", "virtualmachineinstances/unpause",
                       "virtualmachineinstances/softreboot"]
CONSOLE_RESOURCE: Final = "virtualmachineinstances/console"
"""Reading a VMI's serial console (`virtctl console`, `virtbus console`): a `get` of this
subresource, which KubeVirt's edit and admin roles grant and view does not (a console may
show what the guest prints of its secrets)."""


def console_request(namespace: str) -> Request:
    """The request reading a VMI's serial console in `namespace` stands for."""
    return Request("get", SUBRESOURCES_GROUP, CONSOLE_RESOURCE, namespace)


def _cluster_role(name: str, *rules: PolicyRule) -> ClusterRole:
    return ClusterRole(metadata=Metadata(name=name), rules=list(rules))


def _kubevirt_writer(name: str, verbs: list[str]) -> ClusterRole:
    return _cluster_role(
        name,
        PolicyRule(api_groups=[KUBEVIRT_GROUP], resources=_KUBEVIRT_RESOURCES, verbs=verbs),
        PolicyRule(api_groups=[INSTANCETYPE_GROUP], resources=_INSTANCETYPE_RESOURCES,
                   verbs=verbs),
        PolicyRule(api_groups=[SUBRESOURCES_GROUP], resources=_VM_ACTIONS + _VMI_ACTIONS,
                   verbs=["update"]),
        PolicyRule(api_groups=[SUBRESOURCES_GROUP], resources=[CONSOLE_RESOURCE],
                   verbs=["get"]))


BUILTIN_CLUSTER_ROLES: Final = {
    role.metadata.name: role for role in (
        _cluster_role("cluster-admin",
                      PolicyRule(api_groups=[WILDCARD], resources=[WILDCARD], verbs=[WILDCARD]),
                      PolicyRule(non_resource_urls=[WILDCARD], verbs=[WILDCARD])),
        _cluster_role("system:monitoring",
                      PolicyRule(non_resource_urls=["/metrics"], verbs=["get"])),
        _kubevirt_writer("kubevirt.io:admin", _ALL_VERBS),
        _kubevirt_writer("kubevirt.io:edit", _ALL_VERBS[:-1]),
        _cluster_role("kubevirt.io:view",
                      PolicyRule(api_groups=[KUBEVIRT_GROUP, INSTANCETYPE_GROUP],
                                 resources=_KUBEVIRT_RESOURCES + _INSTANCETYPE_RESOURCES,
                                 verbs=["get", "list", "watch"])),
    )
}
"""Kubernetes' `cluster-admin` and `system:monitoring` (scrapes `/metrics`), and KubeVirt's
aggregated default roles (virt-operator's `rbac/cluster.go`): view reads, edit also writes
and acts, admin also deletes collections."""

_ACTIONS: Final = {"start": "virtualmachines/start", "stop": "virtualmachines/stop",
                   "restart": "virtualmachines/restart", "migrate": "virtualmachines/migrate",
                   "pause": "virtualmachineinstances/pause",
                   "unpause": "virtualmachineinstances/unpause",
                   "soft-reboot": "virtualmachineinstances/softreboot"}
"""virtctl's verbs: updates of KubeVirt's subresources."""

_OBJECT_VERBS: Final = {"apply": "patch", "patch": "patch", "create": "create",
                        "delete": "delete", "label": "patch", "taint": "patch",
                        "cordon": "patch", "uncordon": "patch", "drain": "patch",
                        "scale": "patch"}
"""kubectl's requests: `apply` (server side), `patch` (and `annotate`, sent as one), `label`,
`taint`, `cordon`, `uncordon`, `drain` (which cordons, then evicts) and `scale` are each a
`patch` of the object (KubeVirt's roles grant no `/scale` subresource: a replica set's
editors scale it)."""


def resource_of(kind: str) -> tuple[str, str]:
    """(API group, resource) of a kind, as its declaration names them; one that is not
    declared is its lowercase name in `virtbus.io`, which only a wildcard rule grants."""
    declared = kinds.kind_named(kind)
    if declared is None:
        return "virtbus.io", kind.lower()
    return declared.group, declared.plural


def command_request(kind: str, verb: str, namespace: str, manifest: object = None
                    ) -> Request:
    """The Kubernetes request a command stands for. The object an `apply` carries is decided
    in its own namespace (`metadata.namespace`, else `default`, as admission defaults it),
    whatever the envelope says: that is where the handler puts it. A cluster-scoped kind's
    (a node, the HyperConverged and its operands, cluster instancetypes) is decided at the
    cluster scope, whatever the envelope or the manifest says: its handler acts on the one
    cluster object, so a grant in one namespace must not reach it."""
    if kinds.is_cluster_scoped(kind):
        namespace = ""
    elif verb == "apply" and isinstance(manifest, dict):
        meta = manifest.get("metadata")
        inner = meta.get("namespace") if isinstance(meta, dict) else None
        namespace = inner if isinstance(inner, str) and inner else DEFAULT_NAMESPACE
    if verb in _ACTIONS:
        return Request("update", SUBRESOURCES_GROUP, _ACTIONS[verb], namespace)
    if verb == "migrate-cancel":  # virtctl deletes the VMI's migration
        return Request("delete", *resource_of("VirtualMachineInstanceMigration"), namespace)
    group, resource = resource_of(kind)
    return Request(_OBJECT_VERBS.get(verb, verb), group, resource, namespace)


class Policy:
    """Decides requests by user; `Policy.open()` allows everything (no policy configured)."""

    def __init__(self, objects: Iterable[RbacObject] = (), *, enforced: bool = True) -> None:
        self.enforced = enforced
        self.roles: dict[tuple[str, str], Role | ClusterRole] = {
            ("", name): role for name, role in BUILTIN_CLUSTER_ROLES.items()}
        self.bindings: list[RoleBinding | ClusterRoleBinding] = []
        for obj in objects:
            match obj:
                case Role(metadata=meta):
                    self.roles[(meta.namespace or "default", meta.name)] = obj
                case ClusterRole(metadata=meta):
                    self.roles[("", meta.name)] = obj
                case RoleBinding() | ClusterRoleBinding():
                    self.bindings.append(obj)

    @classmethod
    def open(cls) -> Policy:
        return cls(enforced=False)

    @property
    def users(self) -> list[str]:
        """Every user some binding names: the NATS identities a secured install needs."""
        return sorted({s.name for b in self.bindings for s in b.subjects})

    def allows(self, user: str, request: Request | PathRequest) -> bool:
        namespace = request.namespace if isinstance(request, Request) else ""
        return not self.enforced or any(
            rule.grants(request) for rule in self._rules_for(user, namespace))

    def namespaces(self, user: str, verb: str, group: str, resource: str) -> set[str] | None:
        """Where `user` may `verb` the resource: None for everywhere (a cluster-wide grant),
        else the namespaces of the RoleBindings that grant it."""
        if self.allows(user, Request(verb, group, resource)):
            return None
        return {b.metadata.namespace or "default" for b in self._bindings_of(user)
                if isinstance(b, RoleBinding)
                and self.allows(user, Request(verb, group, resource,
                                              b.metadata.namespace or "default"))}

    def _bindings_of(self, user: str) -> Iterator[RoleBinding | ClusterRoleBinding]:
        return (b for b in self.bindings if any(s.name == user for s in b.subjects))

    def _rules_for(self, user: str, namespace: str) -> Iterator[PolicyRule]:
        for binding in self._bindings_of(user):
            scope = ""
            if isinstance(binding, RoleBinding):
                scope = binding.metadata.namespace or "default"
                if scope != namespace:  # a RoleBinding grants in its own namespace only
                    continue
            ref = binding.role_ref
            role = self.roles.get(("", ref.name) if ref.kind == "ClusterRole"
                                  else (scope, ref.name))
            if role is not None:
                yield from role.rules


def _url_matches(url: str, path: str) -> bool:
    """Kubernetes' nonResourceURLs: the path itself, `*`, or a prefix ending in `*`."""
    return url == path or (url.endswith(WILDCARD) and path.startswith(url[:-1]))


def _matches(allowed: list[str], value: str) -> bool:
    return WILDCARD in allowed or value in allowed


def parse_policy(text: str, source: str = "policy") -> Policy:
    """A policy from YAML documents; a malformed one is `InvalidSpec` naming the document and
    the field."""
    objects: list[RbacObject] = []
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise InvalidSpec(source, f"not YAML: {e}") from None
    for index, doc in enumerate(documents):
        try:
            objects.append(msgspec.convert(doc, RbacObject))
        except msgspec.ValidationError as e:
            raise InvalidSpec(f"{source}[{index}]", str(e)) from None
    return Policy(objects)


def load_policy(path: str | Path | None) -> Policy:
    """The policy in `path`, or the open policy when none is configured."""
    if not path:
        return Policy.open()
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InvalidSpec(str(path), f"cannot read the policy: {e.strerror or e}") from None
    return parse_policy(text, str(path))


POLICY_ENV: Final = "VIRTBUS_POLICY"


def add_policy_argument(parser: argparse.ArgumentParser) -> None:
    """`--policy FILE` (env VIRTBUS_POLICY) of the processes that decide with it."""
    parser.add_argument("--policy", default=os.environ.get(POLICY_ENV, ""),
                        help="RBAC policy (YAML); without one, every user may do everything "
                             "(env VIRTBUS_POLICY)")

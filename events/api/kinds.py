"""Every kind virtbus serves, declared once, as KubeVirt's `kubevirt.io/api` states each
kind's metadata once: its API group and versions, names (kind, plural, singular, short
names, categories), scope, the aggregate-id token its events live under, its printer
columns and subresources, and how `apply` admits it. Every table that lists kinds (apply's
admission, the policy's groups and scope, the names a person types, the read API's paths,
discovery, OpenAPI and tables, the CLI's tables, the aggregate-id tokens) is derived from
these declarations, never kept by hand.

A kind is declared in the module of its API schema with `declare(Kind(...))`. The first
look-up imports every module of `events.api`, so every declaration is known with nothing
listing the modules that hold them (and parsing a command line imports none of them).
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from events.api.base import ApiStruct
from events.api.errors import InvalidSpec
from events.api.names import check_dns1123_label

ColumnType = Literal["string", "integer", "number", "boolean", "date"]


def at_path(obj: dict[str, Any], json_path: str) -> Any:
    """The value at a dotted JSON path (`.status.phase`) of an object, or None."""
    value: Any = obj
    for key in json_path.strip(".").split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


@dataclass(frozen=True)
class Column:
    """A printer column, as a CRD's `additionalPrinterColumns` states one: kubectl's table
    header, the JSON path it reads, its type (a `date` shows as an age). `value` computes it
    where the path alone cannot say it (a condition's status, a percentage)."""

    name: str
    json_path: str
    type: ColumnType = "string"
    description: str = ""
    value: Callable[[dict[str, Any]], Any] | None = None
    priority: int = 0

    def cell(self, obj: dict[str, Any]) -> Any:
        """The column's value for a rendered object."""
        return self.value(obj) if self.value is not None else at_path(obj, self.json_path)


NAME: Final = Column("NAME", ".metadata.name", description="the object's name")
AGE: Final = Column("AGE", ".metadata.creationTimestamp", "date",
                    description="when the object was created")


def condition_status(obj: dict[str, Any], condition: str) -> str:
    """`.status.conditions[?(@.type=='<condition>')].status`, '' when there is none."""
    for item in at_path(obj, ".status.conditions") or ():
        if isinstance(item, dict) and item.get("type") == condition:
            return str(item.get("status", ""))
    return ""


@dataclass(frozen=True, kw_only=True)
class Kind:
    """One kind's declaration. `token` names its objects' aggregates
    (`<token>.<namespace>.<name>`) and so its events' subjects; `manifest` is the API type
    `apply` decodes (None: the kind is written by virtbus only, as a Node or a
    ControllerRevision), admitted by `name_rule` and `validate`."""

    kind: str
    group: str
    versions: tuple[str, ...]
    plural: str
    token: str
    short_names: tuple[str, ...] = ()
    singular: str = ""
    categories: tuple[str, ...] = ()
    namespaced: bool = True
    one_per_cluster: bool = False
    """One object for the whole cluster, whatever namespace it shows (the HyperConverged and
    its operands): decided at the cluster scope, its id holds no namespace."""
    columns: tuple[Column, ...] = (NAME, AGE)
    subresources: tuple[str, ...] = ()
    manifest: type[ApiStruct] | None = None
    name_rule: Callable[[str, str], None] = check_dns1123_label
    validate: Callable[[Any], None] | None = None
    verbs: tuple[str, ...] = ()
    """Verbs its API serves; () for every verb of a kind with a `manifest`, else only reads."""
    aliases: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if not self.singular:
            object.__setattr__(self, "singular", self.kind.lower())
        object.__setattr__(self, "aliases", tuple(dict.fromkeys(
            (*self.short_names, self.singular, self.plural))))

    @property
    def api_version(self) -> str:
        """The version objects are shown in: `group/version`, or `version` for the core
        group."""
        return self.api_versions[0]

    @property
    def api_versions(self) -> tuple[str, ...]:
        """Every `apiVersion` a manifest of this kind may say."""
        return tuple(f"{self.group}/{v}" if self.group else v for v in self.versions)

    @property
    def cluster_scoped(self) -> bool:
        """Decided at the cluster scope: its objects are the cluster's."""
        return not self.namespaced or self.one_per_cluster

    @property
    def served_verbs(self) -> tuple[str, ...]:
        reads = ("get", "list", "watch")
        if self.verbs:
            return self.verbs
        return (*reads, "create", "update", "patch", "delete") if self.manifest else reads

    @property
    def shown_name(self) -> str:
        """The name a list of kinds shows for it: its first short name, else its singular."""
        return self.short_names[0] if self.short_names else self.singular


class _Registry:
    """The declarations, with an index by token and by resource, and a generation that
    moves with every change (for the caches of tables derived from them)."""

    def __init__(self) -> None:
        self.by_name: dict[str, Kind] = {}
        self.by_token: dict[str, Kind] = {}
        self.by_resource: dict[tuple[str, str], Kind] = {}
        self.ordered: tuple[Kind, ...] = ()
        self.generation = 0
        self.loaded = False
        self.loading = threading.RLock()

    def load(self) -> _Registry:
        """The registry once every module of `events.api` is imported (the first look-up
        imports them; a look-up made while they import sees what is declared so far)."""
        if not self.loaded:
            with self.loading:
                if not self.loaded:
                    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
                        importlib.import_module(f"{__package__}.{module.name}")
                    self.loaded = True
        return self

    def changed(self) -> None:
        self.by_token = {k.token: k for k in self.by_name.values()}
        self.by_resource = {(k.group, k.plural): k for k in self.by_name.values()}
        self.ordered = tuple(sorted(self.by_name.values(), key=lambda k: (k.group, k.kind)))
        self.generation += 1


_REGISTRY: Final = _Registry()


def declare(kind: Kind) -> Kind:
    """Register a kind's declaration; a second, different declaration of a name, a token or
    a resource is a programming error."""
    known = _REGISTRY.by_name
    for other in known.values():
        if other.kind != kind.kind and (other.token == kind.token or (
                other.group, other.plural) == (kind.group, kind.plural)):
            raise ValueError(f"{kind.kind} takes {other.kind}'s token or resource")
    if known.get(kind.kind, kind) != kind:
        raise ValueError(f"kind {kind.kind} is already declared")
    known[kind.kind] = kind
    _REGISTRY.changed()
    return kind


def forget(name: str) -> None:
    """Take a declaration back (a test's throwaway kind)."""
    if _REGISTRY.by_name.pop(name, None) is not None:
        _REGISTRY.changed()


def generation() -> int:
    """A number that changes whenever a kind is declared or forgotten."""
    return _REGISTRY.load().generation


def declared() -> tuple[Kind, ...]:
    """Every declared kind, by group and kind."""
    return _REGISTRY.load().ordered


def kind_named(name: str) -> Kind | None:
    return _REGISTRY.load().by_name.get(name)


def of_token(token: str) -> Kind | None:
    """The kind whose aggregates carry `token`."""
    return _REGISTRY.load().by_token.get(token)


def of_resource(group: str, plural: str) -> Kind | None:
    """The kind an API path names by group and resource (`kubevirt.io`, `virtualmachines`)."""
    return _REGISTRY.load().by_resource.get((group, plural))


def resolve(text: str) -> Kind:
    """The kind a person typed: its name, or (any case) its singular, plural or a short
    name, as kubectl resolves them."""
    kinds = declared()
    for kind in kinds:
        if text == kind.kind or text.lower() in kind.aliases:
            return kind
    names = ", ".join(k.shown_name for k in kinds)
    raise InvalidSpec("kind", f"must be one of {names} (or their full names), not {text!r}")


def is_cluster_scoped(name: str) -> bool:
    """Whether a kind's objects are the cluster's (no namespace in their id, decided at the
    cluster scope)."""
    declared = kind_named(name)
    return declared is not None and declared.cluster_scoped


def token_of(name: str) -> str:
    """The aggregate-id token of a kind's objects; an undeclared kind's is its lowercase
    name (a command naming such a kind goes on a subject of its own, and is refused)."""
    declared = kind_named(name)
    return declared.token if declared is not None else name.lower()


def name_of_token(token: str) -> str:
    """The kind whose aggregates carry `token`, or the token itself for an aggregate of no
    declared kind (virtbus's own, as a workload update)."""
    declared = of_token(token)
    return declared.kind if declared is not None else token

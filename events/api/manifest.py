"""From YAML text to typed objects, with errors that name the field and the rule."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec
import msgspec.inspect
import yaml

from events.api.base import DNS1123_LABEL, ApiStruct
from events.api.errors import InvalidSpec
from events.api.validation import (
    DNS1123_LABEL_MAX,
    DNS1123_LABEL_RULE,
    DNS1123_SUBDOMAIN,
    DNS1123_SUBDOMAIN_MAX,
    DNS1123_SUBDOMAIN_RULE,
    validate_vmi_spec,
)
from events.api.vm import (
    API_VERSION,
    RUN_STRATEGIES,
    SUPPORTED_RUN_STRATEGIES,
    VirtualMachine,
    VirtualMachineInstance,
)


def check_dns1123_label(field: str, value: str) -> None:
    if not value:
        raise InvalidSpec(field, "is required")
    if len(value) > DNS1123_LABEL_MAX or not DNS1123_LABEL.fullmatch(value):
        raise InvalidSpec(field, DNS1123_LABEL_RULE)


class KindRules(msgspec.Struct, frozen=True):
    """How `apply` admits one kind: the apiVersions it serves, its type, the rule its names
    follow, whether it lives outside namespaces, and the kind's own admission checks."""

    api_versions: tuple[str, ...]
    cls: type[ApiStruct]
    name_rule: Callable[[str, str], None]
    cluster_scoped: bool = False
    validate: Callable[[Any], None] | None = None


def check_dns1123_subdomain(field: str, value: str) -> None:
    """Most Kubernetes objects' names (`u1.medium`): labels joined by dots."""
    if not value:
        raise InvalidSpec(field, "is required")
    if len(value) > DNS1123_SUBDOMAIN_MAX or not DNS1123_SUBDOMAIN.fullmatch(value):
        raise InvalidSpec(field, DNS1123_SUBDOMAIN_RULE)


KINDS: dict[str, KindRules] = {
    "VirtualMachine": KindRules((API_VERSION,), VirtualMachine, check_dns1123_label),
    "VirtualMachineInstance": KindRules((API_VERSION,), VirtualMachineInstance,
                                        check_dns1123_label),
}
"""Kinds `apply` accepts. Other modules register theirs."""


def register_kind(kind: str, api_versions: str | tuple[str, ...], cls: type[ApiStruct], *,
                  name_rule: Callable[[str, str], None] = check_dns1123_label,
                  cluster_scoped: bool = False,
                  validate: Callable[[Any], None] | None = None) -> None:
    versions = (api_versions,) if isinstance(api_versions, str) else api_versions
    KINDS[kind] = KindRules(versions, cls, name_rule, cluster_scoped, validate)


def parse_documents(text: str, source: str = "input") -> list[dict[str, Any]]:
    """Every non-empty document of a (multi-document) YAML or JSON text."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise InvalidSpec(source, f"must be valid YAML: {e}") from None
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise InvalidSpec(f"{source}[{i}]", "each document must be a mapping (an object)")
    return docs


def _field_path(message: str) -> tuple[str, str]:
    """Split msgspec's `... - at `$.spec.x`` into (`spec.x`, rule)."""
    rule, sep, where = message.rpartition(" - at `$")
    if not sep:
        return "(root)", message
    path = where.rstrip("`").lstrip(".")
    return path or "(root)", rule


def _unwrap(node: Any) -> Any:
    """Through optionals, lists and maps to the type of the values they hold."""
    while True:
        match node:
            case msgspec.inspect.UnionType(types=types):
                literal = [t for t in types if isinstance(t, msgspec.inspect.LiteralType)]
                rest = [t for t in types if not isinstance(t, msgspec.inspect.NoneType)]
                node = literal[0] if literal else rest[0]
            case msgspec.inspect.ListType(item_type=item):
                node = item
            case msgspec.inspect.DictType(value_type=value):
                node = value
            case _:
                return node


def _allowed_values(cls: type[Any], path: str) -> list[str]:
    """The values a Literal-typed field at `path` (`spec.template.x[0].y`) accepts."""
    node: Any = msgspec.inspect.type_info(cls)
    for token in re.sub(r"\[\d+\]", "", path).split("."):
        node = _unwrap(node)
        if not isinstance(node, msgspec.inspect.StructType):
            return []
        field = next((f for f in node.fields if f.encode_name == token), None)
        if field is None:
            return []
        node = field.type
    node = _unwrap(node)
    return [str(v) for v in node.values] if isinstance(node, msgspec.inspect.LiteralType) else []


def decode_object(doc: dict[str, Any], *, default_namespace: str = "default") -> ApiStruct:
    """A typed object from one parsed document, admitted as KubeVirt's webhooks admit it:
    shape, names, and every VMI spec rule (`validate_vmi_spec`) on the VMI or VM template.
    Rules that depend on the cluster (feature gates, and the spec of a VM with an instancetype
    or a preference, which only their expansion completes) are the control plane's."""
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise InvalidSpec("kind", f"must be one of {', '.join(sorted(KINDS))}, not {kind!r}")
    rules = KINDS[kind]
    if doc.get("apiVersion") not in rules.api_versions:
        raise InvalidSpec("apiVersion",
                          f"must be {' or '.join(rules.api_versions)} for kind {kind}")
    try:
        obj = msgspec.convert(doc, rules.cls)
    except msgspec.ValidationError as e:
        field, rule = _field_path(str(e))
        enum = rule.startswith("Invalid enum value")
        allowed = _allowed_values(rules.cls, field) if enum else []
        if allowed:
            rule = f"must be one of {', '.join(allowed)}, not {rule.rpartition(' ')[2]}"
        raise InvalidSpec(field, rule) from None
    meta = getattr(obj, "metadata", None)
    if meta is not None:
        rules.name_rule("metadata.name", meta.name)
        if rules.cluster_scoped:
            meta.namespace = ""
        else:
            meta.namespace = meta.namespace or default_namespace
            check_dns1123_label("metadata.namespace", meta.namespace)
    if isinstance(obj, VirtualMachine):
        validate_vm(obj)
        if obj.spec.instancetype is None and obj.spec.preference is None:
            validate_vmi_spec(obj.spec.template.spec, "spec.template.spec")
    elif isinstance(obj, VirtualMachineInstance):
        validate_vmi_spec(obj.spec, "spec")
    elif rules.validate is not None:
        rules.validate(obj)
    return obj


def validate_vm(vm: VirtualMachine) -> None:
    spec = vm.spec
    if spec.running is not None and spec.run_strategy is not None:
        raise InvalidSpec("spec.running", "cannot be set together with spec.runStrategy")
    if spec.effective_run_strategy not in RUN_STRATEGIES:
        raise InvalidSpec("spec.runStrategy",
                          f"must be one of {', '.join(RUN_STRATEGIES)}, not {spec.run_strategy!r}")
    if spec.effective_run_strategy not in SUPPORTED_RUN_STRATEGIES:
        raise InvalidSpec(
            "spec.runStrategy",
            f"must be one of {', '.join(SUPPORTED_RUN_STRATEGIES)} "
            f"(others are not supported yet), not {spec.run_strategy!r}",
        )

"""From YAML text to typed objects, with errors that name the field and the rule: each kind
admitted as its declaration (`events.api.kinds`) says."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import msgspec.inspect
import yaml

from events.api.base import ApiStruct
from events.api.errors import InvalidSpec
from events.api.kinds import declared, kind_named
from events.api.names import check_dns1123_label


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
    rules = kind_named(kind) if isinstance(kind, str) else None
    if rules is None or rules.manifest is None:
        admitted = sorted(k.kind for k in declared() if k.manifest is not None)
        raise InvalidSpec("kind", f"must be one of {', '.join(admitted)}, not {kind!r}")
    if doc.get("apiVersion") not in rules.api_versions:
        raise InvalidSpec("apiVersion",
                          f"must be {' or '.join(rules.api_versions)} for kind {kind}")
    try:
        obj = msgspec.convert(doc, rules.manifest)
    except msgspec.ValidationError as e:
        field, rule = _field_path(str(e))
        enum = rule.startswith("Invalid enum value")
        allowed = _allowed_values(rules.manifest, field) if enum else []
        if allowed:
            rule = f"must be one of {', '.join(allowed)}, not {rule.rpartition(' ')[2]}"
        raise InvalidSpec(field, rule) from None
    meta = getattr(obj, "metadata", None)
    if meta is not None:
        rules.name_rule("metadata.name", meta.name)
        if not rules.namespaced:
            meta.namespace = ""
        else:
            meta.namespace = meta.namespace or default_namespace
            check_dns1123_label("metadata.namespace", meta.namespace)
    if rules.validate is not None:
        rules.validate(obj)
    return obj

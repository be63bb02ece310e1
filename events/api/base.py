"""The shape every KubeVirt API object shares: camelCase on the wire, unknown fields refused."""

from __future__ import annotations

import msgspec


class ApiStruct(
    msgspec.Struct,
    rename="camel",
    forbid_unknown_fields=True,
    omit_defaults=True,
    kw_only=True,
):
    """Base for spec types: a typo in a manifest is an error naming the field, never ignored.

    Not frozen: mypy's dataclass_transform would demand `frozen=True` on every subclass.
    Specs are still treated as values; nothing mutates one after decoding. msgspec applies
    `kw_only` per class, so subclasses list required fields first.
    """


class ObjectMeta(ApiStruct):
    """The subset of Kubernetes ObjectMeta that virtbus keeps; the rest is set by projections."""

    name: str = ""
    namespace: str = ""
    generate_name: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    uid: str = ""
    generation: int = 0
    resource_version: str = ""
    creation_timestamp: str | None = None
    """Set by the server; `null` as `kubectl create --dry-run -o yaml` writes it is absent."""
    deletion_timestamp: str = ""
    finalizers: list[str] = []
    owner_references: list[dict[str, object]] = []

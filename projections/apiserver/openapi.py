"""OpenAPI v3, as kube-apiserver publishes it: an index at `/openapi/v3` naming one document
per group and version (`apis/kubevirt.io/v1`, `api/v1`), and each document at its
`serverRelativeURL`, so `kubectl explain vm.spec.runStrategy` finds the field.

Each document is generated from the kinds' manifests (their msgspec Structs) by
`msgspec.json.schema_components`; nothing is written by hand. Two adjustments make it what
kubectl's explain reads: each kind's schema carries `x-kubernetes-group-version-kind` (under
the kind's own name, where its manifest's class is named otherwise or shared), and each path
of a kind carries its GVK on its operations (explain finds the kind by its path first); an
optional field (`X | None`, JSON Schema's `anyOf` with null) is written as OpenAPI 3.0 does,
`nullable` (explain follows neither `anyOf` nor a null type). A kind with no manifest (one
virtbus writes alone: Node, ControllerRevision) gets an object schema of its metadata. An
arbitrary value (`object`) is `x-kubernetes-preserve-unknown-fields`, as in a CRD.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any, Final

import msgspec

from events.api.base import ApiStruct, ObjectMeta
from events.api.kinds import Kind, declared
from projections.apiserver.discovery import GroupVersion, group_versions

REF: Final = "#/components/schemas/{name}"
GVK_KEY: Final = "x-kubernetes-group-version-kind"
NULL: Final = {"type": "null"}
Answer = tuple[int, str, bytes]


def gv_path(gv: GroupVersion) -> str:
    """The index's key of a group and version: `api/v1`, `apis/<group>/<version>`."""
    return f"apis/{gv.group}/{gv.version}" if gv.group else f"api/{gv.version}"


def _schema_hook(t: type) -> dict[str, Any]:
    if t is object:
        return {"x-kubernetes-preserve-unknown-fields": True}
    raise NotImplementedError


def _nullable(schema: Any) -> Any:
    """`schema` with every `anyOf: [X, null]` made `X` with `nullable: true` (a reference
    wrapped in `allOf`, as kube-openapi writes a reference with siblings), and every other
    `anyOf` with null the other options, `nullable`."""
    if isinstance(schema, list):
        return [_nullable(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {k: _nullable(v) for k, v in schema.items()}
    options = schema.get("anyOf")
    if not isinstance(options, list) or NULL not in options:
        return schema
    others = [o for o in options if o != NULL]
    rest = {k: v for k, v in schema.items() if k != "anyOf"}
    if len(others) > 1:  # a quantity: a string or a number
        return {"anyOf": others, **rest, "nullable": True}
    [other] = others
    shaped = {"allOf": [other]} if "$ref" in other else dict(other)
    return {**shaped, **rest, "nullable": True}


def _gvk(kind: Kind, version: str) -> dict[str, str]:
    return {"group": kind.group, "version": version, "kind": kind.kind}


def _operations(kind: Kind, version: str, ref: str) -> dict[str, dict[str, Any]]:
    """The read paths of a kind with their `get` operations, each naming its GVK."""
    base = f"/apis/{kind.group}/{version}" if kind.group else f"/api/{version}"
    scope = f"{base}/namespaces/{{namespace}}" if kind.namespaced else base

    def get(action: str) -> dict[str, Any]:
        return {"get": {GVK_KEY: _gvk(kind, version), "x-kubernetes-action": action,
                        "responses": {"200": {"description": "OK", "content": {
                            "application/json": {"schema": {"$ref": ref}}}}}}}
    return {f"{scope}/{kind.plural}": get("list"), f"{scope}/{kind.plural}/{{name}}": get("get")}


def document(gv: GroupVersion) -> dict[str, Any]:
    """The OpenAPI v3 document of one group and version."""
    manifests = list(dict.fromkeys(k.manifest for k in gv.kinds if k.manifest is not None))
    types: list[type[ApiStruct]] = [*manifests, ObjectMeta]
    _, components = msgspec.json.schema_components(types, schema_hook=_schema_hook,
                                                   ref_template=REF)
    schemas: dict[str, Any] = _nullable(components)
    paths: dict[str, Any] = {}
    for kind in gv.kinds:
        own = _component_name(kind.manifest, schemas) if kind.manifest is not None else ""
        name = kind.kind if kind.kind == own or kind.kind not in schemas else (
            f"{gv_path(gv).replace('/', '.')}.{kind.kind}")
        if kind.manifest is not None:
            schema = dict(schemas[own])
        else:
            schema = {"type": "object", "description": f"A {kind.kind}, written by virtbus.",
                      "properties": {"apiVersion": {"type": "string"},
                                     "kind": {"type": "string"},
                                     "metadata": {"$ref": REF.format(name="ObjectMeta")}},
                      "x-kubernetes-preserve-unknown-fields": True}
        schemas[name] = {**schema, GVK_KEY: [_gvk(kind, gv.version)]}
        paths |= _operations(kind, gv.version, REF.format(name=name))
    return {"openapi": "3.0.0", "info": {"title": "virtbus", "version": gv.name},
            "paths": paths, "components": {"schemas": schemas}}


def _component_name(manifest: type, schemas: dict[str, Any]) -> str:
    """The component msgspec named a class by: its name, or its full path where two classes
    share one."""
    qualified = f"{manifest.__module__}.{manifest.__qualname__}"
    return qualified if qualified in schemas else manifest.__name__


def _digest(body: bytes) -> str:
    return hashlib.sha512(body).hexdigest().upper()


@lru_cache(maxsize=4)
def _documents(kinds: tuple[Kind, ...]) -> dict[str, bytes]:
    """Every group and version's document, encoded, by its index key; cached by the
    declarations (declared at import; a test's own kind is another key)."""
    return {gv_path(gv): json.dumps(document(gv)).encode() for gv in group_versions(kinds)}


def index(kinds: tuple[Kind, ...]) -> dict[str, Any]:
    """`/openapi/v3`: each document's path, with a hash of its content (as kube-apiserver
    gives one, for clients' caches)."""
    return {"paths": {key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={_digest(body)}"}
                      for key, body in _documents(kinds).items()}}


def answer(path: str) -> Answer | None:
    """(status, content type, body) of an OpenAPI path, None for any other path."""
    kinds = tuple(declared())
    path = path.rstrip("/")
    if path == "/openapi/v3":
        return 200, "application/json", json.dumps(index(kinds)).encode()
    if path.startswith("/openapi/v3/"):
        body = _documents(kinds).get(path.removeprefix("/openapi/v3/"))
        if body is not None:
            return 200, "application/json", body
    return None

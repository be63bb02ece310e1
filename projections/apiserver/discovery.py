"""API discovery, as kube-apiserver serves it, from the kinds' declarations: which groups,
versions and resources this server has, so that kubectl resolves `vm` to
`virtualmachines.v1.kubevirt.io` and `kubectl api-resources` lists every kind.

Two forms, both derived from `events.api.kinds.declared()`:

- the legacy documents: `/api` (`APIVersions`), `/api/v1` and `/apis/<group>/<version>`
  (`APIResourceList`), `/apis` (`APIGroupList`), `/apis/<group>` (`APIGroup`);
- aggregated discovery (`apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`), every group and
  resource in one answer at `/api` (the core group) and `/apis` (the others), which kubectl
  1.30+ asks for first and which is answered with that media type as its Content-Type.

Subresources listed are those a CustomResourceDefinition can have in its own group (`status`,
`scale`); virtctl's (`start`, `pause`, `console`, ...) live in `subresources.kubevirt.io`,
which this server does not serve yet.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from events.api.kinds import Kind, declared
from projections.apiserver.media import JSON, first_served, plain_json

AGGREGATED: Final = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
"""The media type of aggregated discovery: asked in `Accept`, answered as Content-Type."""
SUBRESOURCES: Final = {"status": ("", "", ""), "scale": ("autoscaling", "v1", "Scale")}
"""A CRD's subresources (kube's convention, not a list of kinds) and the group, version and
kind each answers with (empty: the kind's own)."""
SUBRESOURCE_VERBS: Final[tuple[str, ...]] = ("get", "patch", "update")

Answer = tuple[int, str, bytes]


@dataclass(frozen=True)
class GroupVersion:
    group: str
    version: str
    kinds: tuple[Kind, ...]

    @property
    def name(self) -> str:
        """`group/version`, or `version` for the core group."""
        return f"{self.group}/{self.version}" if self.group else self.version


def group_versions(kinds: Iterable[Kind]) -> tuple[GroupVersion, ...]:
    """Every group and version the kinds are served at, in order of declaration (a group's
    versions in its kinds' order of preference), each with its kinds."""
    served: dict[tuple[str, str], list[Kind]] = {}
    for kind in kinds:
        for version in kind.versions:
            served.setdefault((kind.group, version), []).append(kind)
    return tuple(GroupVersion(g, v, tuple(ks)) for (g, v), ks in served.items())


def _groups(kinds: tuple[Kind, ...]) -> dict[str, list[GroupVersion]]:
    groups: dict[str, list[GroupVersion]] = {}
    for gv in group_versions(kinds):
        groups.setdefault(gv.group, []).append(gv)
    return groups


def _subresources(kind: Kind) -> list[tuple[str, dict[str, str], list[str]]]:
    """(name, response kind, verbs) of each subresource the kind's group serves."""
    verbs = [v for v in SUBRESOURCE_VERBS if v in kind.served_verbs]
    found = []
    for name in kind.subresources:
        if name in SUBRESOURCES:
            group, version, kind_name = SUBRESOURCES[name]
            found.append((name, {"group": group or kind.group,
                                 "version": version or kind.versions[0],
                                 "kind": kind_name or kind.kind}, verbs))
    return found


def resource_list(gv: GroupVersion) -> dict[str, Any]:
    """`/apis/<group>/<version>` (`/api/v1`): metav1 `APIResourceList`."""
    resources: list[dict[str, Any]] = []
    for kind in gv.kinds:
        resources.append({
            "name": kind.plural, "singularName": kind.singular, "namespaced": kind.namespaced,
            "kind": kind.kind, "verbs": list(kind.served_verbs),
            **({"shortNames": list(kind.short_names)} if kind.short_names else {}),
            **({"categories": list(kind.categories)} if kind.categories else {})})
        resources += [{"name": f"{kind.plural}/{name}", "singularName": "",
                       "namespaced": kind.namespaced, "group": answers["group"],
                       "version": answers["version"], "kind": answers["kind"], "verbs": verbs}
                      for name, answers, verbs in _subresources(kind)]
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv.name,
            "resources": resources}


def _for_discovery(gv: GroupVersion) -> dict[str, str]:
    return {"groupVersion": gv.name, "version": gv.version}


def api_group(name: str, versions: list[GroupVersion]) -> dict[str, Any]:
    """`/apis/<group>`: metav1 `APIGroup` (its first version preferred)."""
    return {"kind": "APIGroup", "apiVersion": "v1", "name": name,
            "versions": [_for_discovery(gv) for gv in versions],
            "preferredVersion": _for_discovery(versions[0])}


def legacy(kinds: tuple[Kind, ...], path: str) -> dict[str, Any] | None:
    """The legacy discovery document at `path`, or None if it names none."""
    groups = _groups(kinds)
    match [p for p in path.split("/") if p]:
        case ["api"]:
            return {"kind": "APIVersions",
                    "versions": [gv.version for gv in groups.get("", [])],
                    "serverAddressByClientCIDRs": []}
        case ["apis"]:
            named = [{k: v for k, v in api_group(g, gvs).items() if k not in ("kind",
                                                                                "apiVersion")}
                     for g, gvs in groups.items() if g]
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": named}
        case ["apis", group] if group and group in groups:
            return api_group(group, groups[group])
        case ["api", version]:
            return next((resource_list(gv) for gv in groups.get("", [])
                         if gv.version == version), None)
        case ["apis", group, version] if group:
            return next((resource_list(gv) for gv in groups.get(group, [])
                         if gv.version == version), None)
    return None


def _resource_discovery(kind: Kind, version: str) -> dict[str, Any]:
    """apidiscovery/v2 `APIResourceDiscovery` of a kind at one version."""
    return {
        "resource": kind.plural,
        "responseKind": {"group": kind.group, "version": version, "kind": kind.kind},
        "scope": "Namespaced" if kind.namespaced else "Cluster",
        "singularResource": kind.singular, "verbs": list(kind.served_verbs),
        **({"shortNames": list(kind.short_names)} if kind.short_names else {}),
        **({"categories": list(kind.categories)} if kind.categories else {}),
        **({"subresources": [{"subresource": name, "responseKind": answers, "verbs": verbs}
                             for name, answers, verbs in subs]}
           if (subs := _subresources(kind)) else {})}


def aggregated(kinds: tuple[Kind, ...], core: bool) -> dict[str, Any]:
    """apidiscovery/v2 `APIGroupDiscoveryList`: the core group's (`/api`) or every other
    group's (`/apis`), each version's resources with it."""
    items = [{"metadata": {"name": group, "creationTimestamp": None},
              "versions": [{"version": gv.version,
                            "resources": [_resource_discovery(k, gv.version) for k in gv.kinds],
                            "freshness": "Current"} for gv in gvs]}
             for group, gvs in _groups(kinds).items() if (group == "") == core]
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {}, "items": items}


def _wants(media: str, params: dict[str, str]) -> bool | None:
    """True for aggregated discovery (v2), False for the legacy form, None for neither."""
    if media == JSON and (params.get("g"), params.get("v"), params.get("as")) == (
            "apidiscovery.k8s.io", "v2", "APIGroupDiscoveryList"):
        return True
    return False if plain_json(media, params) else None


def answer(path: str, accept: str) -> Answer | None:
    """(status, content type, body) of a discovery path, None for any other path."""
    return _answer(tuple(declared()), path.rstrip("/") or "/", accept)


@lru_cache(maxsize=64)
def _answer(kinds: tuple[Kind, ...], path: str, accept: str) -> Answer | None:
    """Cached by the declarations and the request: kinds are declared at import (a test may
    declare one of its own, which is another key)."""
    if path in ("/api", "/apis") and first_served(accept, _wants, False):
        body = aggregated(kinds, core=path == "/api")
        return 200, AGGREGATED, json.dumps(body).encode()
    document = legacy(kinds, path)
    return None if document is None else (200, JSON, json.dumps(document).encode())

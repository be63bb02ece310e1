"""Discovery, OpenAPI and tables are functions of the kinds' declarations: every declared kind
(and one declared by this test alone) shows in each, with what its declaration says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

import msgspec
import pytest

from events.api.base import ApiStruct, ObjectMeta
from events.api.kinds import AGE, NAME, Column, Kind, declare, declared, forget
from events.api.node import NODE
from events.api.virtualmachines import VIRTUAL_MACHINE
from projections.apiserver import discovery, openapi, tables

KUBECTL_DISCOVERY: Final = ("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
                            "application/json;g=apidiscovery.k8s.io;v=v2beta1;"
                            "as=APIGroupDiscoveryList,application/json")
KUBECTL_TABLE: Final = ("application/json;as=Table;v=v1;g=meta.k8s.io,"
                        "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json")
"""What kubectl 1.32 sends in `Accept` for discovery and for `get`."""


class WidgetSpec(ApiStruct):
    size: int = 1
    colour: Literal["red", "blue"] | None = None


class Widget(ApiStruct):
    """A widget, declared by this test alone."""

    metadata: ObjectMeta
    spec: WidgetSpec = msgspec.field(default_factory=WidgetSpec)
    api_version: str = "example.virtbus.io/v1"
    kind: Literal["Widget"] = "Widget"


WIDGET: Final = Kind(kind="Widget", group="example.virtbus.io", versions=("v1", "v1alpha1"),
                     plural="widgets", token="widget", short_names=("wdg",),
                     categories=("all",), manifest=Widget, subresources=("status", "frob"),
                     columns=(NAME, Column("SIZE", ".spec.size", "integer"), AGE,
                              Column("COLOUR", ".spec.colour", priority=1)))


@pytest.fixture
def widget() -> Iterator[Kind]:
    declare(WIDGET)
    try:
        yield WIDGET
    finally:
        forget(WIDGET.kind)


def body(answer: tuple[int, str, bytes] | None) -> dict[str, Any]:
    assert answer is not None and answer[0] == 200
    document: dict[str, Any] = json.loads(answer[2])
    return document


def test_legacy_discovery_lists_every_declared_kind(widget: Kind) -> None:
    groups = body(discovery.answer("/apis", "application/json"))
    assert groups["kind"] == "APIGroupList"
    assert {g["name"] for g in groups["groups"]} == {k.group for k in declared() if k.group}
    [example] = [g for g in groups["groups"] if g["name"] == "example.virtbus.io"]
    assert example["preferredVersion"] == {"groupVersion": "example.virtbus.io/v1",
                                           "version": "v1"}
    assert [v["version"] for v in example["versions"]] == ["v1", "v1alpha1"]
    assert body(discovery.answer("/api", ""))["versions"] == ["v1"]
    for kind in declared():
        for version in kind.versions:
            path = f"/apis/{kind.group}/{version}" if kind.group else f"/api/{version}"
            listed = body(discovery.answer(path, ""))
            entry = next(r for r in listed["resources"] if r["name"] == kind.plural)
            assert (entry["kind"], entry["singularName"], entry["namespaced"],
                    entry["verbs"], entry.get("shortNames", [])) == (
                kind.kind, kind.singular, kind.namespaced, list(kind.served_verbs),
                list(kind.short_names))
    widgets = body(discovery.answer("/apis/example.virtbus.io/v1alpha1", ""))["resources"]
    assert [r["name"] for r in widgets] == ["widgets", "widgets/status"]  # no virtctl verbs
    assert widgets[0]["categories"] == ["all"]
    assert discovery.answer("/apis/example.virtbus.io/v2", "") is None
    assert discovery.answer("/apis/nosuch.io", "") is None


def test_aggregated_discovery_as_kubectl_asks(widget: Kind) -> None:
    code, content_type, raw = discovery.answer("/apis", KUBECTL_DISCOVERY) or (0, "", b"")
    assert (code, content_type) == (200, discovery.AGGREGATED)
    listed = json.loads(raw)
    assert (listed["kind"], listed["apiVersion"]) == ("APIGroupDiscoveryList",
                                                      "apidiscovery.k8s.io/v2")
    names = [g["metadata"]["name"] for g in listed["items"]]
    assert names == list(dict.fromkeys(k.group for k in declared() if k.group))
    [example] = [g for g in listed["items"] if g["metadata"]["name"] == "example.virtbus.io"]
    [v1, _] = example["versions"]
    [resource] = v1["resources"]
    assert resource == {
        "resource": "widgets", "singularResource": "widget", "scope": "Namespaced",
        "responseKind": {"group": "example.virtbus.io", "version": "v1", "kind": "Widget"},
        "verbs": list(WIDGET.served_verbs), "shortNames": ["wdg"], "categories": ["all"],
        "subresources": [{"subresource": "status", "responseKind": resource["responseKind"],
                          "verbs": ["get", "patch", "update"]}]}
    core = body(discovery.answer("/api", KUBECTL_DISCOVERY))
    [group] = core["items"]
    assert group["metadata"]["name"] == "" and [r["resource"] for r in group["versions"][0][
        "resources"]] == [NODE.plural]
    # The first media type served wins: plain JSON asked first is the legacy form.
    _, legacy_type, _ = discovery.answer("/apis", "application/json," + KUBECTL_DISCOVERY) or (
        0, "", b"")
    assert legacy_type == "application/json"


def test_openapi_has_every_declared_kind_by_its_gvk(widget: Kind) -> None:
    index = body(openapi.answer("/openapi/v3"))["paths"]
    expected = {openapi.gv_path(gv) for gv in discovery.group_versions(tuple(declared()))}
    assert set(index) == expected and "apis/example.virtbus.io/v1alpha1" in index
    for kind in declared():
        for version in kind.versions:
            key = f"apis/{kind.group}/{version}" if kind.group else f"api/{version}"
            url = index[key]["serverRelativeURL"]
            assert url.startswith(f"/openapi/v3/{key}?hash=")
            document = body(openapi.answer(url.partition("?")[0]))
            gvk = {"group": kind.group, "version": version, "kind": kind.kind}
            [schema] = [s for s in document["components"]["schemas"].values()
                        if gvk in s.get("x-kubernetes-group-version-kind", [])]
            assert "properties" in schema
            operations = [op for path in document["paths"].values() for op in path.values()]
            assert sum(op["x-kubernetes-group-version-kind"] == gvk for op in operations) == 2
            assert '{"type": "null"}' not in json.dumps(document)  # nullable, for explain
    widget_doc = body(openapi.answer("/openapi/v3/apis/example.virtbus.io/v1"))
    spec = widget_doc["components"]["schemas"]["WidgetSpec"]["properties"]
    assert spec["colour"] == {"enum": ["blue", "red"], "default": None, "nullable": True}
    assert spec["size"]["type"] == "integer"
    assert openapi.answer("/openapi/v3/apis/nosuch.io/v1") is None


def test_table_of_a_list_shows_the_declared_columns() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    created = (now - timedelta(minutes=5, seconds=12)).isoformat().replace("+00:00", "Z")
    vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
          "metadata": {"name": "web", "namespace": "default", "creationTimestamp": created},
          "status": {"printableStatus": "Running", "ready": True}}
    listed = {"items": [vm], "metadata": {"resourceVersion": "7", "continue": "c"}}
    shown = tables.table(VIRTUAL_MACHINE, listed, "", now)
    assert (shown["kind"], shown["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert shown["metadata"] == {"resourceVersion": "7", "continue": "c"}
    definitions = shown["columnDefinitions"]
    assert [d["name"] for d in definitions] == [c.name for c in VIRTUAL_MACHINE.columns]
    assert [d["type"] for d in definitions] == ["string", "date", "string", "boolean"]
    assert definitions[0]["format"] == "name" and definitions[1]["format"] == ""
    [row] = shown["rows"]
    assert row["cells"] == ["web", "5m12s", "Running", True]
    assert row["object"] == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": vm["metadata"]}
    assert tables.table(VIRTUAL_MACHINE, vm, "Object", now)["rows"][0]["object"] == vm
    assert "object" not in tables.table(VIRTUAL_MACHINE, vm, "None", now)["rows"][0]


def test_table_columns_keep_priority_and_types() -> None:
    gadget = {"metadata": {"name": "g", "creationTimestamp": "not a time"},
              "spec": {"size": "big", "colour": "red"}}
    shown = tables.table(WIDGET, {"items": [gadget], "metadata": {}}, "")
    assert [d["priority"] for d in shown["columnDefinitions"]] == [0, 0, 0, 1]
    assert shown["rows"][0]["cells"] == ["g", None, "<invalid>", "red"]


def test_a_table_is_answered_only_when_asked_first() -> None:
    assert tables.wants_table(KUBECTL_TABLE)
    assert not tables.wants_table("application/json")
    assert not tables.wants_table("")
    assert not tables.wants_table("application/json," + KUBECTL_TABLE)
    assert tables.wants_table("application/vnd.kubernetes.protobuf;as=Table;v=v1;"
                              "g=meta.k8s.io," + KUBECTL_TABLE)
    plain = (200, "application/json", json.dumps({"metadata": {"name": "web"}}).encode())
    assert tables.negotiated(VIRTUAL_MACHINE, plain, "application/json", "") == plain
    missing = (404, "application/json", b"{}")
    assert tables.negotiated(VIRTUAL_MACHINE, missing, KUBECTL_TABLE, "") == missing
    assert json.loads(tables.negotiated(VIRTUAL_MACHINE, plain, KUBECTL_TABLE, "")[2])[
        "kind"] == "Table"


@pytest.mark.parametrize(("seconds", "age"), [
    (-5, "<invalid>"), (-1, "0s"), (0, "0s"), (119, "119s"), (120, "2m"), (312, "5m12s"),
    (600, "10m"), (3 * 3600 + 12 * 60, "3h12m"), (5 * 3600, "5h"), (30 * 3600, "30h"),
    (52 * 3600, "2d4h"), (72 * 3600, "3d"), (400 * 86400, "400d"), (800 * 86400, "2y70d"),
    (730 * 86400, "2y"), (3000 * 86400, "8y")])
def test_ages_are_worded_as_kube_apiserver_words_them(seconds: int, age: str) -> None:
    assert tables.human_duration(seconds) == age

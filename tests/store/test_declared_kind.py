"""A kind declared here, in this file alone (its schema and one `declare`), and nowhere else:
`apply` admits it and the control plane decides it on the real store, the log's events
decode, the policy decides it as a resource of its group, the read model folds it, a query
(and the read service, over NATS) renders it, the CLI lists it with its columns and names,
and the read API routes its paths. No other file of the tree knows it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any, Final, Literal

import msgspec
import pytest
from nats.errors import NoRespondersError

from controlplane.user.actions import printed_rows
from events.api.base import ApiStruct, ObjectMeta
from events.api.kinds import AGE, NAME, Column, Kind, declare, forget, resolve
from events.authorization.policy import Request, command_request, parse_policy
from events.jetstream.connect import connect
from events.language.messages import Command
from events.language.query import Answer, Query, query_subject
from events.language.subjects import Layout
from projections.http import route
from projections.kinds import FOLDS
from projections.kinds.objects import ObjectView
from projections.rendering import render
from projections.service import ReadService
from tests.store.helpers import SyncHandler, replayed

GROUP: Final = "example.virtbus.io"


class GadgetSpec(ApiStruct):
    size: int = 1


class Gadget(ApiStruct):
    metadata: ObjectMeta
    spec: GadgetSpec = msgspec.field(default_factory=GadgetSpec)
    api_version: str = f"{GROUP}/v1"
    kind: Literal["Gadget"] = "Gadget"


GADGET: Final = Kind(kind="Gadget", group=GROUP, versions=("v1",), plural="gadgets",
                     token="gadget", short_names=("gdg",), manifest=Gadget,
                     columns=(NAME, Column("SIZE", ".spec.size", "integer"), AGE))


@pytest.fixture(autouse=True)
def declared() -> Iterator[Kind]:
    """The declaration, for this test only (the read side, loaded already, learns it as it
    meets its events)."""
    declare(GADGET)
    try:
        yield GADGET
    finally:
        forget(GADGET.kind)
        FOLDS.pop(GADGET.token, None)


def command(verb: str, name: str, manifest: dict[str, Any] | None = None) -> Command:
    return Command(id=str(uuid.uuid4()), actor="user:dana", kind="Gadget", verb=verb,
                   namespace="team", name=name, manifest=manifest)


def gadget(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": "Gadget",
            "metadata": {"name": name, "namespace": "team", "labels": {"tier": "gold"}},
            "spec": spec}


def test_a_kind_declared_once_is_decided_decoded_folded_rendered_and_listed(
        handler: SyncHandler, prefix: str) -> None:
    created = handler.execute(command("apply", "g1", gadget("g1", size=3))).outcome
    assert created.accepted and len(created.sequences) == 1
    assert handler.execute(command("apply", "g1", gadget("g1", size=3))).outcome.sequences == []
    changed = handler.execute(command("apply", "g1", gadget("g1", size=5))).outcome
    assert changed.accepted and len(changed.sequences) == 1
    refused = handler.execute(command("apply", "g2", gadget("g2", colour="red"))).outcome
    assert (refused.accepted, refused.field) == (False, "spec")
    assert "colour" in refused.reason

    state = replayed(handler, Layout(prefix))  # every event decoded from the log
    [view] = state.of_token("gadget")
    assert isinstance(view, ObjectView)
    [shown] = render(state, Query(kind="Gadget", namespace="team"))
    assert shown["apiVersion"] == f"{GROUP}/v1" and shown["kind"] == "Gadget"
    assert shown["spec"] == {"size": 5}
    assert shown["metadata"]["generation"] == 2 and shown["metadata"]["uid"] == view.uid
    assert shown["metadata"]["labels"] == {"tier": "gold"}
    assert render(state, Query(kind="Gadget", namespace="elsewhere")) == []
    changed_by_its_asker = render(state, Query(kind="Gadget"))[0]
    changed_by_its_asker["spec"]["size"] = 7  # as the read service redacts its answers
    assert render(state, Query(kind="Gadget"))[0]["spec"] == {"size": 5}

    header, row = printed_rows("gdg", [shown])
    assert header == ["NAME", "SIZE", "AGE"] and row[:2] == ["g1", "5"]
    assert resolve("gadgets").kind == resolve("GDG").kind == "Gadget"
    assert route(f"/apis/{GROUP}/v1/namespaces/team/gadgets/g1") == (
        Query(kind="Gadget", namespace="team", name="g1"), True)
    assert route(f"/apis/{GROUP}/v1/gadgets") == (Query(kind="Gadget"), False)

    deleted = handler.execute(command("delete", "g1")).outcome
    assert deleted.accepted
    assert render(replayed(handler, Layout(prefix)), Query(kind="Gadget")) == []


async def test_the_read_service_answers_a_query_of_a_declared_kind(
        handler: SyncHandler, nats_url: str, prefix: str) -> None:
    created = await asyncio.to_thread(handler.execute,
                                      command("apply", "g1", gadget("g1", size=2)))
    layout = Layout(prefix)
    nc = await connect(nats_url, "test-declared-kind")
    stop = asyncio.Event()
    reads = asyncio.ensure_future(ReadService(nc, layout).run(stop))
    query = Query(kind="Gadget", namespace="team", after=created.outcome.sequences[0])
    try:
        async with asyncio.timeout(10):
            while True:  # until the read service listens
                try:
                    reply = await nc.request(query_subject(layout, "user:dana"),
                                             msgspec.msgpack.encode(query), timeout=5)
                    break
                except NoRespondersError:
                    await asyncio.sleep(0.05)
        answer = msgspec.msgpack.decode(reply.data, type=Answer)
        assert [(o["metadata"]["name"], o["spec"]) for o in answer.items] == [
            ("g1", {"size": 2})]
    finally:
        stop.set()
        await reads
        await nc.close()


def test_a_kind_declared_once_is_authorized_as_a_resource_of_its_group() -> None:
    request = command_request("Gadget", "apply", "team", gadget("g1"))
    assert request == Request("patch", GROUP, "gadgets", "team")
    policy = parse_policy(f"""
kind: Role
apiVersion: rbac.authorization.k8s.io/v1
metadata: {{name: gadgets, namespace: team}}
rules: [{{apiGroups: ["{GROUP}"], resources: [gadgets], verbs: [patch, get]}}]
---
kind: RoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata: {{name: dana, namespace: team}}
roleRef: {{kind: Role, name: gadgets}}
subjects: [{{kind: User, name: dana}}]
""")
    assert policy.allows("dana", request)
    assert not policy.allows("dana", command_request("Gadget", "apply", "other",
                                                      {"metadata": {"namespace": "other"}}))
    assert not policy.allows("dana", command_request("Gadget", "delete", "team"))

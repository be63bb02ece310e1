"""Tenants are kept apart on the read side too (issue 8, finding 5): the read service answers
each asker (named by the subject it asks on, which its NATS identity pins) with what the
policy lets it get or list; a node agent sees its own node's VMIs only; cloud-init secrets
are shown only to who may change the object; the HTTP API answers as `system:anonymous`."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as Nats

from controlplane.writer import Writer
from events.authorization.policy import load_policy
from events.jetstream.streams import ensure_all
from events.language.messages import Command
from events.language.query import FORBIDDEN, Answer, Query, ask
from events.language.subjects import Layout
from projections.http import respond
from projections.service import REDACTED, ReadService
from tests.system.harness import eventually, vm_manifest

POLICY = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "policy.yaml"
SECRET = "#cloud-config\npassword: hunter2\n"


class Reads:
    def __init__(self, nc: Nats, layout: Layout, service: ReadService, head: int) -> None:
        self.nc, self.layout, self.service = nc, layout, service
        self.head = head
        """The last sequence written: every query waits until the service has read it."""

    async def names(self, asker: str, kind: str, namespace: str = "") -> list[str]:
        items = await self.items(asker, kind, namespace)
        return [f"{i['metadata'].get('namespace', '')}/{i['metadata']['name']}" for i in items]

    async def items(self, asker: str, kind: str, namespace: str = "",
                    name: str = "") -> list[dict[str, Any]]:
        answer = await self.answer(asker, kind, namespace, name)
        assert not answer.error, answer.error
        return answer.items

    async def answer(self, asker: str, kind: str, namespace: str = "",
                     name: str = "") -> Answer:
        return await ask(self.nc, self.layout, Query(kind=kind, namespace=namespace,
                                                     name=name, after=self.head), asker)


def _vm(name: str, namespace: str) -> dict[str, Any]:
    manifest = vm_manifest(name, "Halted")
    manifest["metadata"] = {"name": name, "namespace": namespace}
    spec = manifest["spec"]["template"]["spec"]
    spec["domain"]["devices"]["disks"] = [{"name": "cloudinit", "disk": {"bus": "virtio"}}]
    spec["volumes"] = [{"name": "cloudinit", "cloudInitNoCloud": {"userData": SECRET}}]
    return manifest


async def _run(writer: Writer, actor: str, kind: str, verb: str, *, namespace: str = "",
               name: str = "", manifest: dict[str, Any] | None = None) -> Any:
    result = await writer.execute(Command(id=str(uuid.uuid4()), actor=actor, kind=kind,
                                          verb=verb, namespace=namespace, name=name,
                                          manifest=manifest))
    assert result.outcome.accepted, result.outcome.reason
    return result


@pytest.fixture
async def reads(nats_url: str, prefix: str) -> AsyncIterator[Reads]:
    layout = Layout(prefix)
    nc = await nats.connect(nats_url)
    await ensure_all(nc.jetstream(), layout)
    writer = Writer(nc, layout)
    for namespace in ("tenant-a", "tenant-b"):
        await _run(writer, "operator", "VirtualMachine", "apply",
                   manifest=_vm("web", namespace))
    for node, name in (("n1", "on-n1"), ("n2", "on-n2")):
        vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
               "metadata": {"name": name, "namespace": "tenant-a"},
               "spec": {"domain": {"devices": {},
                                   "resources": {"requests": {"memory": "64Mi"}}}}}
        await _run(writer, "operator", "VirtualMachineInstance", "apply", manifest=vmi)
        result = await _run(writer, "system:controller:scheduler", "VirtualMachineInstance",
                            "schedule", namespace="tenant-a", name=name,
                            manifest={"node": node})
    service = ReadService(nc, layout, load_policy(POLICY))
    stop = asyncio.Event()
    task = asyncio.ensure_future(service.run(stop))
    out = Reads(nc, layout, service, result.events[-1][0])
    try:
        async def answering() -> bool:
            await out.items("operator", "Node")  # raises until the service listens
            return True

        await eventually(answering, what="the read service")
        yield out
    finally:
        stop.set()
        await task
        await nc.close()


async def test_each_asker_sees_what_the_policy_grants(reads: Reads) -> None:
    both = ["tenant-a/web", "tenant-b/web"]
    assert await reads.names("operator", "VirtualMachine") == both
    assert await reads.names("alice", "VirtualMachine") == ["tenant-a/web"]
    assert await reads.names("bob", "VirtualMachine") == ["tenant-a/web"]
    refused = await reads.answer("alice", "VirtualMachine", "tenant-b")
    assert (refused.reason, refused.items) == (FORBIDDEN, [])
    assert refused.error == ('forbidden: User \'alice\' cannot list resource "virtualmachines" '
                             'in API group "kubevirt.io" in the namespace "tenant-b"')
    assert await reads.names("mallory", "VirtualMachine") == []
    assert await reads.names("alice", "HyperConverged") == []


async def test_a_node_agent_sees_its_own_vmis_only(reads: Reads) -> None:
    assert await reads.names("system:node:n1", "VirtualMachineInstance") == ["tenant-a/on-n1"]
    assert await reads.names("system:node:n2", "VirtualMachineInstance") == ["tenant-a/on-n2"]
    assert await reads.names("system:node:n1", "VirtualMachine") == []
    assert await reads.names("system:node:n1", "KubeVirt") == await reads.names(
        "operator", "KubeVirt")


async def test_metrics_only_to_who_may_get_the_metrics_path(reads: Reads) -> None:
    """The metrics' series name every namespace's VMs: over NATS, as over HTTP, only who may
    get `/metrics` (the operator here) has them; alice and a node agent are forbidden."""
    [metrics] = await reads.items("operator", "Metrics")
    assert 'namespace="tenant-b"' in str(metrics["text"])
    for asker in ("alice", "system:node:n1"):
        refused = await reads.answer(asker, "Metrics")
        assert (refused.reason, refused.items) == (FORBIDDEN, []), asker
        assert refused.error == (f"forbidden: User {asker!r} cannot get path "
                                 '"/metrics"'), refused.error


async def test_cloud_init_secrets_only_to_who_may_change_the_object(reads: Reads) -> None:
    def user_data(items: list[dict[str, Any]]) -> str:
        [vm] = items
        [volume] = vm["spec"]["template"]["spec"]["volumes"]
        return str(volume["cloudInitNoCloud"]["userData"])

    assert user_data(await reads.items("alice", "VirtualMachine", "tenant-a")) == SECRET
    assert user_data(await reads.items("bob", "VirtualMachine", "tenant-a")) == REDACTED
    # ... and redacting the viewer's answer left the read model as it was
    assert user_data(await reads.items("operator", "VirtualMachine", "tenant-a")) == SECRET


async def test_the_http_api_answers_as_anonymous(reads: Reads) -> None:
    await reads.names("operator", "VirtualMachine")  # the service has read everything
    service = reads.service
    code, _, body = respond(service.state, service.render,
                            "/apis/kubevirt.io/v1/virtualmachines")
    assert code == 200 and json.loads(body)["items"] == []
    code, _, _ = respond(service.state, service.render,
                         "/apis/kubevirt.io/v1/namespaces/tenant-a/virtualmachines/web")
    assert code == 404
    code, _, body = respond(service.state, service.render, "/metrics")
    assert code == 200 and body

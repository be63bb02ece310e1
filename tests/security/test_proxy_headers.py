"""Behind kube-rbac-proxy the HTTP read API answers as the user the proxy authenticated
(issue 8): the proxy checks the caller's Kubernetes token, drops it, and names the user in
`X-Remote-User` (`--auth-header-fields-enabled`). Before, the API saw every proxied request
as `system:anonymous`. The header is believed only when the API is told to trust it and
the request comes from loopback (the proxy is a sidecar in the pod); from anywhere else
anyone could send it, so it is ignored there, and logged."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from controlplane.writer import Writer
from events.authorization.policy import load_policy
from events.jetstream.connect import connect
from events.jetstream.streams import ensure_all
from events.language.messages import Command
from events.language.subjects import Layout
from projections import http
from projections.http import REMOTE_USER_HEADER
from projections.service import ReadService
from tests.security.conftest import POLICY
from tests.system.harness import eventually, vm_manifest

VMS = "/apis/kubevirt.io/v1/virtualmachines"
IGNORED = "ignored an identity header from an untrusted peer"


def _vm(namespace: str) -> dict[str, Any]:
    manifest = vm_manifest("web", "Halted")
    manifest["metadata"] = {"name": "web", "namespace": namespace}
    return manifest


@pytest.fixture
async def service(nats_url: str, prefix: str) -> AsyncIterator[ReadService]:
    """The read service on the shipped policy, its model holding a VM in tenant-a and one
    in tenant-b."""
    layout = Layout(prefix)
    nc = await connect(nats_url, "test")
    await ensure_all(nc.jetstream(), layout)
    writer = Writer(nc, layout)
    for namespace in ("tenant-a", "tenant-b"):
        result = await writer.execute(Command(id=str(uuid.uuid4()), actor="operator",
                                              kind="VirtualMachine", verb="apply",
                                              manifest=_vm(namespace)))
        assert result.outcome.accepted, result.outcome.reason
    read = ReadService(nc, layout, load_policy(POLICY))
    stop = asyncio.Event()
    task = asyncio.ensure_future(read.run(stop))

    async def both() -> bool:
        return len(list(read.state.views)) >= 2

    await eventually(both, what="the read model, past both applies")
    try:
        yield read
    finally:
        stop.set()
        await task
        await nc.close()


async def _namespaces(url: str, user: str) -> tuple[int, list[str]]:
    """The status, and the namespaces of the VMs listed, for a GET naming `user`."""
    async with aiohttp.ClientSession() as session, session.get(
            url + VMS, headers={REMOTE_USER_HEADER: user}) as response:
        body = await response.json()
        return response.status, sorted(i["metadata"]["namespace"] for i in body["items"])


async def _metrics(url: str, user: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(
            url + http.METRICS_PATH, headers={REMOTE_USER_HEADER: user}) as response:
        return response.status


async def _serving(service: ReadService, host: str, *, trust: bool) -> tuple[
        aiohttp.web.AppRunner, int]:
    runner = await http.serve(service.state, service, host, 0, trust_proxy_headers=trust)
    [(_, port, *_)] = runner.addresses
    return runner, port


async def test_the_proxy_names_who_asks(service: ReadService) -> None:
    runner, port = await _serving(service, "127.0.0.1", trust=True)
    url = f"http://127.0.0.1:{port}"
    try:
        assert await _namespaces(url, "alice") == (200, ["tenant-a"])
        assert await _namespaces(url, "operator") == (200, ["tenant-a", "tenant-b"])
        assert await _namespaces(url, "mallory") == (200, [])
        # A kubelet is named `system:node:<node>` behind the proxy: no node agent's sight.
        async with aiohttp.ClientSession() as session, session.get(
                url + VMS, headers={REMOTE_USER_HEADER: "system:node:n1"}) as response:
            assert response.status == 403, await response.text()
        assert await _metrics(url, "operator") == 200
        assert await _metrics(url, "alice") == 403
    finally:
        await runner.cleanup()


async def test_without_trust_the_header_is_ignored(service: ReadService) -> None:
    runner, port = await _serving(service, "127.0.0.1", trust=False)
    try:
        with capture_logs() as logs:
            assert await _namespaces(f"http://127.0.0.1:{port}", "operator") == (200, [])
        assert [e["event"] for e in logs if e["event"] == IGNORED] == [IGNORED]
    finally:
        await runner.cleanup()


def _outside_address() -> str:
    """An address of this machine that is not loopback: where a request comes from another
    host's point of view (a UDP socket's connect sends nothing, only picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: any routed address will do
        address = str(probe.getsockname()[0])
    assert not address.startswith("127."), address
    return address


async def test_a_header_from_off_the_pod_is_ignored(service: ReadService) -> None:
    """Trusted, but listening on every interface: a request from a non-loopback address
    naming `operator` is answered as `system:anonymous` (nothing), and logged."""
    runner, port = await _serving(service, "0.0.0.0", trust=True)
    try:
        with capture_logs() as logs:
            outside = f"http://{_outside_address()}:{port}"
            assert await _namespaces(outside, "operator") == (200, [])
            assert await _metrics(outside, "operator") == 403
            assert await _namespaces(f"http://127.0.0.1:{port}", "operator") == (
                200, ["tenant-a", "tenant-b"])
        assert [e["peer"] for e in logs if e["event"] == IGNORED] == [
            _outside_address()] * 2
    finally:
        await runner.cleanup()

"""The HTTP read API answers at kube-apiserver paths from the same read model."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from controlplane.user.client import Client
from tests.system.harness import System, eventually, vm_manifest, vmi_phase


def fetch(port: int, path: str, method: str = "GET") -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            body = r.read()
            return r.status, json.loads(body) if r.headers["Content-Type"].startswith(
                "application/json") else body.decode()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def test_http_read_api(system: System, vb: Client) -> None:
    await vb.apply(vm_manifest("web"))
    vmi = await eventually(lambda: vmi_phase(vb, "web", "Running"), what="VMI Running")
    get = lambda path: asyncio.to_thread(fetch, system.http_port, path)  # noqa: E731

    code, vms = await get("/apis/kubevirt.io/v1/namespaces/default/virtualmachines")
    assert code == 200 and vms["kind"] == "VirtualMachineList"
    assert [v["metadata"]["name"] for v in vms["items"]] == ["web"]
    code, one = await get("/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/web")
    assert code == 200 and one["metadata"]["uid"] == vmi["metadata"]["uid"]
    code, nodes = await get("/api/v1/nodes")
    assert code == 200 and {n["metadata"]["name"] for n in nodes["items"]} == {"node-1",
                                                                                "node-2"}
    code, missing = await get("/apis/kubevirt.io/v1/namespaces/default/virtualmachines/nope")
    assert code == 404 and missing["reason"] == "NotFound"
    code, metrics = await get("/metrics")
    assert code == 200 and "# TYPE" in metrics
    hco = "/apis/hco.kubevirt.io/v1beta1/namespaces/{}/hyperconvergeds/kubevirt-hyperconverged"
    code, found = await get(hco.format("kubevirt-hyperconverged"))
    assert code == 200 and found["kind"] == "HyperConverged"
    code, elsewhere = await get(hco.format("default"))  # the one HCO lives in its namespace
    assert code == 404 and elsewhere["reason"] == "NotFound"
    code, unknown = await get("/apis/other")
    assert code == 404 and unknown["kind"] == "Status"
    code, refused = await asyncio.to_thread(fetch, system.http_port, "/api/v1/nodes", "POST")
    assert code == 405 and refused["reason"] == "MethodNotAllowed"

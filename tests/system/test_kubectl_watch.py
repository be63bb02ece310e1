"""resourceVersion and watch over the HTTP API (issue 33): `kubectl get vmi -w` prints phase
changes live; a raw watch resumed from a resourceVersion older than a thousand events gets
every change after it, in order, and no 410; a list at an exact resourceVersion answers the
state then; `/version` answers kubectl."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controlplane.user.client import Client
from tests.system.harness import System, eventually, vm_manifest, vmi_phase
from tests.system.test_kubectl import KUBECTL, Kubectl

VMS = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines"
READ_SECONDS = 60.0


async def lines_until(lines: AsyncIterator[str], done: Callable[[list[str]], bool],
                      timeout: float = READ_SECONDS) -> list[str]:
    """Lines read from `lines` until `done` holds of all read so far; fails after `timeout`
    with what was read."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while not done(seen):
        left = deadline - time.monotonic()
        try:
            seen.append(await asyncio.wait_for(anext(lines), max(left, 0.01)))
        except (TimeoutError, StopAsyncIteration):
            raise AssertionError(f"not seen within {timeout}s; read: {seen}") from None
    return seen


async def watch_lines(session: aiohttp.ClientSession, url: str,
                      headers: dict[str, str] | None = None) -> AsyncGenerator[str, None]:
    async with session.get(url, headers=headers or {}) as response:
        assert response.status == 200, (response.status, await response.text())
        async for line in response.content:
            yield line.decode()


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (no `kubectl` on PATH)")
async def test_kubectl_get_vmi_w_prints_phase_changes(system: System, vb: Client,
                                                      tmp_path: Path) -> None:
    await vb.apply(vm_manifest("web"))
    await eventually(lambda: vmi_phase(vb, "web", "Running"), what="VMI Running")
    kubectl = Kubectl(tmp_path, system.http_port)
    version = await kubectl("version", "-o", "json")
    assert json.loads(version)["serverVersion"]["gitVersion"].startswith("v1.32.0+virtbus")
    proc = await asyncio.create_subprocess_exec(
        *kubectl.args, "get", "vmi", "-w", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None

    async def out() -> AsyncIterator[str]:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            yield line.decode()

    printed = out()
    try:
        first = await lines_until(printed, lambda seen: len(seen) >= 2)
        assert first[0].split()[:3] == ["NAME", "AGE", "PHASE"], first
        assert first[1].split()[0] == "web" and "Running" in first[1], first
        await vb.act("VirtualMachine", "stop", "default", "web")
        stopped = await lines_until(printed, lambda seen: any(
            "Succeeded" in line for line in seen))
        assert all(line.split()[0] == "web" for line in stopped), stopped
        await vb.act("VirtualMachine", "start", "default", "web")
        started = await lines_until(printed, lambda seen: any(
            "Running" in line for line in seen))
        phases = [line.split()[2] for line in started if len(line.split()) > 2]
        assert phases[-1] == "Running" and len(phases) >= 2, started  # Pending/Scheduling...
    finally:
        proc.terminate()
        await proc.wait()


async def test_a_watch_resumes_from_a_thousand_events_back(system: System, vb: Client) -> None:
    names = [f"vm-{i}" for i in range(10)]
    await vb.apply(*(vm_manifest(n, "Halted") for n in names))
    port = system.http_port
    async with aiohttp.ClientSession() as session:
        async def listed() -> dict[str, Any] | None:
            async with session.get(f"http://127.0.0.1:{port}{VMS}") as r:
                body: dict[str, Any] = await r.json()
            return body if len(body["items"]) == len(names) else None

        start = int((await eventually(listed, what="the list past the applies"))
                    ["metadata"]["resourceVersion"])

        async def relabel(name: str) -> None:
            for i in range(110):
                manifest = vm_manifest(name, "Halted")
                manifest["metadata"]["labels"] = {"step": str(i)}
                await vb.apply(manifest)

        await asyncio.gather(*(relabel(n) for n in names))  # 1,100 changes after `start`
        url = f"http://127.0.0.1:{port}{VMS}?watch=true&resourceVersion={start}"
        events = watch_lines(session, url)
        read = await lines_until(events, lambda seen: len(seen) >= 1100, timeout=120)
        await events.aclose()
    decoded = [json.loads(line) for line in read]
    assert {e["type"] for e in decoded} == {"MODIFIED"}, decoded[:3]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in decoded]
    assert versions == sorted(versions) and versions[0] > start and len(set(versions)) == 1100
    for name in names:
        steps = [e["object"]["metadata"]["labels"]["step"] for e in decoded
                 if e["object"]["metadata"]["name"] == name]
        assert steps == [str(i) for i in range(110)], (name, steps)


async def test_a_list_at_an_exact_resource_version(system: System, vb: Client) -> None:
    await vb.apply(vm_manifest("gone", "Halted"), vm_manifest("kept", "Halted"))
    port = system.http_port
    async with aiohttp.ClientSession() as session:
        async def get(path: str) -> tuple[int, Any]:
            async with session.get(f"http://127.0.0.1:{port}{path}") as r:
                return r.status, await r.json()

        async def both() -> int | None:
            _, body = await get(VMS)
            names = [v["metadata"]["name"] for v in body["items"]]
            return int(body["metadata"]["resourceVersion"]) if names == ["gone", "kept"] \
                else None

        before = await eventually(both, what="both VMs listed")
        await vb.act("VirtualMachine", "delete", "default", "gone")

        async def deleted() -> int | None:
            _, body = await get(VMS)
            names = [v["metadata"]["name"] for v in body["items"]]
            return int(body["metadata"]["resourceVersion"]) if names == ["kept"] else None

        now = await eventually(deleted, what="the deletion listed")
        code, at = await get(f"{VMS}?resourceVersion={before}&resourceVersionMatch=Exact")
        assert code == 200 and at["metadata"]["resourceVersion"] == str(before), at
        assert [v["metadata"]["name"] for v in at["items"]] == ["gone", "kept"]
        code, one = await get(f"{VMS}/gone?resourceVersion={before}"
                              "&resourceVersionMatch=Exact")
        assert code == 200 and one["metadata"]["name"] == "gone", one
        code, current = await get(f"{VMS}?resourceVersion=0")
        assert [v["metadata"]["name"] for v in current["items"]] == ["kept"], current
        code, missing = await get(f"{VMS}/gone")
        assert code == 404, missing
        code, future = await get(f"{VMS}?resourceVersion={now + 1000}"
                                 "&resourceVersionMatch=Exact")
        assert code == 504 and future["details"]["causes"][0]["reason"] == \
            "ResourceVersionTooLarge", future
        code, bad = await get(f"{VMS}?resourceVersion=0&resourceVersionMatch=Exact")
        assert code == 400, bad
        for path in ("/readyz", "/livez", "/healthz"):
            async with session.get(f"http://127.0.0.1:{port}{path}") as r:
                assert r.status == 200 and await r.text() == "ok"


async def test_watch_list_initial_events_and_bookmark(system: System, vb: Client) -> None:
    await vb.apply(vm_manifest("one", "Halted"), vm_manifest("two", "Halted"))
    port = system.http_port
    url = (f"http://127.0.0.1:{port}{VMS}?watch=1&sendInitialEvents=true"
           "&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=30")
    async with aiohttp.ClientSession() as session:
        async def initial() -> list[dict[str, Any]] | None:
            events = watch_lines(session, url)
            read = await lines_until(events, lambda seen: '"BOOKMARK"' in (seen or [""])[-1])
            await events.aclose()
            decoded = [json.loads(line) for line in read]
            return decoded if len(decoded) == 3 else None

        decoded = await eventually(initial, what="both VMs, then the bookmark")
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in decoded] == [
        ("ADDED", "one"), ("ADDED", "two"), ("BOOKMARK", None)]
    end = decoded[-1]["object"]
    assert end["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert end["kind"] == "VirtualMachine" and end["apiVersion"] == "kubevirt.io/v1"


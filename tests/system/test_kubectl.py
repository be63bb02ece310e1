"""The real kubectl reads virtbus's HTTP API unchanged: discovery (`api-resources`, short
names), server-side tables with each kind's declared columns, `-o yaml`, `-A`, and `explain`
from the OpenAPI v3 documents. kubectl runs with a kubeconfig of its own and a cache
directory of its own (its discovery cache is keyed by host and port, which tests reuse)."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.user.client import Client
from events.api.virtualmachines import VIRTUAL_MACHINE, VIRTUAL_MACHINE_INSTANCE
from tests.system.harness import System, eventually, vm_manifest, vm_status, vmi_phase

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed (no `kubectl` on PATH): these tests "
                            "drive the real binary")


def kubeconfig(tmp_path: Path, port: int) -> Path:
    """A kubeconfig naming the read API, with no credentials (the test system runs open)."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "virtbus",
        "clusters": [{"name": "virtbus", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "anonymous", "user": {}}],
        "contexts": [{"name": "virtbus", "context": {"cluster": "virtbus", "user": "anonymous",
                                                    "namespace": "default"}}]}))
    return path


class Kubectl:
    def __init__(self, tmp_path: Path, port: int) -> None:
        self.args = [str(KUBECTL), "--kubeconfig", str(kubeconfig(tmp_path, port)),
                     "--cache-dir", str(tmp_path / "kube-cache"), "--request-timeout", "20s"]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*self.args, *args], capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done

    async def __call__(self, *args: str) -> str:
        return (await asyncio.to_thread(self.run, *args)).stdout

    async def requests(self, *args: str) -> list[str]:
        """The paths kubectl asked for to run `args` (its `-v=6` log of each request)."""
        done = await asyncio.to_thread(self.run, "-v=6", *args)
        return re.findall(r"\bGET http://[^/]+(/\S*)", done.stderr)


def rows(table: str) -> list[list[str]]:
    """kubectl's printed table, header first, each line split into its cells."""
    return [line.split() for line in table.strip().splitlines()]


async def test_kubectl_reads(system: System, vb: Client, tmp_path: Path) -> None:
    kubectl = Kubectl(tmp_path, system.http_port)
    await vb.apply(vm_manifest("web"))
    await eventually(lambda: vmi_phase(vb, "web", "Running"), what="VMI Running")
    await eventually(lambda: vm_status(vb, "web", "Running"), what="VM Running")

    asked = await kubectl.requests("api-resources")
    # Aggregated discovery answered it all: no group's own resource list was asked.
    assert [p.partition("?")[0] for p in asked] == ["/api", "/apis"], asked
    resources = rows(await kubectl("api-resources"))
    assert resources[0] == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    assert ["virtualmachines", "vm,vms", "kubevirt.io/v1", "true", "VirtualMachine"] in resources
    assert ["nodes", "no", "v1", "false", "Node"] in resources

    vms = rows(await kubectl("get", "vm"))
    assert vms[0] == [c.name for c in VIRTUAL_MACHINE.columns]  # NAME AGE STATUS READY
    [web] = vms[1:]
    assert web[0] == "web" and web[2:] == ["Running", "true"], vms
    assert web[1][-1] in "smhd", web  # an age, as kube-apiserver words one

    listed: dict[str, Any] = yaml.safe_load(await kubectl("get", "vm", "-o", "yaml"))
    [item] = listed["items"]
    assert (item["kind"], item["metadata"]["name"], item["spec"]["runStrategy"]) == (
        "VirtualMachine", "web", "Always")

    vmis = rows(await kubectl("get", "vmi", "-A"))
    assert vmis[0] == ["NAMESPACE", *(c.name for c in VIRTUAL_MACHINE_INSTANCE.columns)]
    [instance] = vmis[1:]
    assert instance[:2] == ["default", "web"] and "Running" in instance, vmis
    assert instance[4] in ("node-1", "node-2"), vmis

    async def both_ready() -> list[list[str]] | None:
        """The nodes' table once both show Ready (a late heartbeat under load can have the
        control plane judge a node NotReady for a moment)."""
        nodes = rows(await kubectl("get", "nodes"))
        ready = sorted(n[:2] for n in nodes[1:]) == [["node-1", "Ready"], ["node-2", "Ready"]]
        return nodes if ready else None

    nodes = await eventually(both_ready, what="kubectl get nodes: node-1 and node-2 Ready")
    assert nodes[0] == ["NAME", "STATUS", "AGE"]

    every = await kubectl("get", "all")  # the `all` category, each kind's name as kind/name
    assert "virtualmachine.kubevirt.io/web " in every, every
    assert "virtualmachineinstance.kubevirt.io/web " in every, every

    one = rows(await kubectl("get", "vm", "web", "-o", "wide"))
    assert [r[0] for r in one] == ["NAME", "web"]


async def test_kubectl_explain(system: System, tmp_path: Path) -> None:
    kubectl = Kubectl(tmp_path, system.http_port)
    explained = await eventually(lambda: kubectl("explain", "vm.spec.runStrategy"),
                                 what="the read API up")
    assert "KIND:       VirtualMachine" in explained and "GROUP:      kubevirt.io" in explained
    assert "FIELD: runStrategy <string>" in explained, explained
    cpu = await kubectl("explain", "vmi.spec.domain.cpu")
    assert "FIELD: cpu <CPU>" in cpu and "cores\t<integer>" in cpu, cpu
    node = await kubectl("explain", "nodes")
    assert "KIND:       Node" in node and "metadata\t<ObjectMeta>" in node, node

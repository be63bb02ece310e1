"""Replica sets and presets on the whole system: the examples' replica set runs its replicas
sized by the preset, `virtbus get vmirs` / `scale` work as kubectl's, and a replica lost to a
node failure is replaced exactly once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from controlplane.user.client import Client
from events.api.manifest import parse_documents
from tests.system.harness import System, eventually, node_ready, topics_since

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RS = "VirtualMachineInstanceReplicaSet"
NAME = "vmi-replicaset-cirros"
CREATED = "VirtualMachineInstanceCreated.v1"
NODE_GRACE_SECONDS = 6.0
"""As the node failure tests: three heartbeats."""


async def apply_examples(vb: Client) -> None:
    for example in ("vmi-preset-small.yaml", "vmi-replicaset-cirros.yaml"):
        path = EXAMPLES / example
        outcomes = await vb.apply(*parse_documents(path.read_text(), path.name))
        assert all(o.accepted for o in outcomes), outcomes


async def running_replicas(vb: Client, count: int) -> list[dict[str, Any]] | None:
    """The replica set's VMIs once exactly `count` are Running and it says so."""
    rs = await vb.get(RS, "default", NAME)
    vmis = [v for v in await vb.query("VirtualMachineInstance", "default")
            if v["metadata"].get("ownerReferences", [{}])[0].get("name") == NAME]
    running = [v for v in vmis if v["status"]["phase"] == "Running"
               and "deletionTimestamp" not in v["metadata"]]
    status = rs["status"]
    if len(running) == count == len(vmis) and status.get("readyReplicas", 0) == count \
            and status.get("replicas", 0) == count:
        return running
    return None


async def replaced(vb: Client, lost: str) -> list[dict[str, Any]] | None:
    """Two replicas Running, neither of them `lost`."""
    running = await running_replicas(vb, 2)
    return running if running and lost not in {v["metadata"]["name"] for v in running} \
        else None


async def cli(system: System, *args: str) -> str:
    env = {**os.environ, "VIRTBUS_NATS_URL": system.nats_url, "VIRTBUS_PREFIX": system.prefix}
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "controlplane.user.cli", *args], env=env,
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_the_example_replica_set_runs_sized_by_the_preset_and_scales(
        system: System, vb: Client) -> None:
    await apply_examples(vb)
    replicas = await eventually(lambda: running_replicas(vb, 2), what="two replicas Running")
    for vmi in replicas:
        assert vmi["metadata"]["name"].startswith(NAME)
        assert vmi["spec"]["domain"]["cpu"]["cores"] == 2
        assert vmi["metadata"]["annotations"]["virtualmachinepreset.kubevirt.io/small"] == \
            "kubevirt.io/v1"

    table = (await cli(system, "get", "vmirs")).splitlines()
    assert table[0].split() == ["NAME", "DESIRED", "CURRENT", "READY", "AGE"]
    assert table[1].split()[:4] == [NAME, "2", "2", "2"]
    assert (await cli(system, "scale", "vmirs", NAME, "--replicas", "1")).strip() == \
        f"virtualmachineinstancereplicaset.kubevirt.io/{NAME} scaled"
    await eventually(lambda: running_replicas(vb, 1), what="one replica left")
    shown = yaml.safe_load(await cli(system, "get", "vmirss", NAME, "-o", "yaml"))
    assert shown["spec"]["replicas"] == 1
    assert shown["status"]["labelSelector"] == f"kubevirt.io/vmReplicaSet={NAME}"


async def test_a_replica_lost_with_its_node_is_replaced_once(
        system: System, vb: Client) -> None:
    await apply_examples(vb)
    before = await eventually(lambda: running_replicas(vb, 2), what="two replicas Running")
    lost = before[0]
    node = lost["status"]["nodeName"]
    system.freeze(node)
    try:
        await eventually(lambda: node_ready(vb, node, False), what=f"{node} NotReady")
        after = await eventually(lambda: replaced(vb, lost["metadata"]["name"]),
                                 what="two replicas Running again, the lost one replaced")
    finally:
        system.thaw(node)
    await eventually(lambda: node_ready(vb, node, True), what=f"{node} Ready again")
    # Exactly three VMIs were ever created (the only ones of this system): the two, and one
    # replacement.
    assert len({v["metadata"]["name"] for v in (*before, *after)}) == 3
    assert (await topics_since(vb, 0)).count(CREATED) == 3
    assert await running_replicas(vb, 2) is not None


def orphan(labels: dict[str, str]) -> dict[str, Any]:
    """A VMI of the example replica set's template, made by hand."""
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "orphan", "namespace": "default", "labels": labels},
            "spec": example_replica_set()["spec"]["template"]["spec"]}


def example_replica_set() -> dict[str, Any]:
    path = EXAMPLES / "vmi-replicaset-cirros.yaml"
    [rs] = parse_documents(path.read_text(), path.name)
    return rs


async def counted(vb: Client, replicas: int, orphan_owned: bool) -> bool:
    """The replica set counts `replicas`, and the orphan's controller is it (or none)."""
    rs = await vb.get(RS, "default", NAME)
    vmi = await vb.get("VirtualMachineInstance", "default", "orphan")
    owners = [o["name"] for o in vmi["metadata"].get("ownerReferences", [])]
    return rs["status"].get("replicas") == replicas and owners == ([NAME] if orphan_owned else [])


async def test_an_orphan_is_adopted_and_released_when_its_labels_change(
        system: System, vb: Client) -> None:
    """Claims run even while the replica set is paused (KubeVirt claims before it scales),
    so the adopted orphan is counted and nothing is scaled away."""
    await apply_examples(vb)
    await eventually(lambda: running_replicas(vb, 2), what="two replicas Running")
    paused = example_replica_set()
    paused["spec"]["paused"] = True
    assert all(o.accepted for o in await vb.apply(paused))

    [taken] = await vb.apply(orphan({"kubevirt.io/vmReplicaSet": NAME}))
    assert taken.accepted, taken.reason
    await eventually(lambda: counted(vb, 3, orphan_owned=True), what="the orphan adopted")

    [relabeled] = await vb.apply(orphan({"app": "elsewhere"}))
    assert relabeled.accepted, relabeled.reason
    await eventually(lambda: counted(vb, 2, orphan_owned=False), what="the orphan released")

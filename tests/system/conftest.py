from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from controlplane.client import Client
from tests.system.harness import System, eventually, ready_nodes


async def hco_settled(vb: Client) -> bool:
    """The default HyperConverged reconciled for two nodes (evictionStrategy follows the node
    count), so the controller appends nothing more until a test changes something."""
    kubevirt = await vb.query("KubeVirt")
    hco = await vb.query("HyperConverged")
    if not kubevirt or not hco:
        return False
    conditions = {c["type"]: c["status"] for c in hco[0]["status"]["conditions"]}
    return (conditions.get("ReconcileComplete") == "True"
            and kubevirt[0]["spec"]["configuration"]["evictionStrategy"] == "LiveMigrate")


@pytest.fixture
def system(nats_url: str, prefix: str, tmp_path: Path) -> Iterator[System]:
    sys_ = System(nats_url, prefix, tmp_path)
    try:
        sys_.start_all()
        yield sys_
    finally:
        sys_.stop_all()


@pytest.fixture
async def vb(system: System) -> AsyncIterator[Client]:
    client = await Client.connect(system.nats_url, system.prefix, actor="user:alice")
    try:
        await eventually(lambda: ready_nodes(client, 2), what="two Ready nodes")
        await eventually(lambda: hco_settled(client), what="the HyperConverged settled")
        yield client
    finally:
        await client.close()

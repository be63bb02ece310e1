from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest

from controlplane.user.client import Client
from tests.system.harness import (
    NODE_GRACE_SECONDS,
    RUNNING,
    System,
    eventually,
    ready_nodes,
)


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
def system(request: pytest.FixtureRequest, nats_url: str, prefix: str,
           tmp_path: Path) -> Iterator[System]:
    grace = getattr(request.module, "NODE_GRACE_SECONDS", NODE_GRACE_SECONDS)
    sys_ = System(nats_url, prefix, tmp_path, node_grace=grace)
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


LOG_TAIL_LINES = 6
LOG_LINE_CHARS = 240


def _notable(line: str) -> bool:
    """A warning or worse, or not a structured log line at all (a traceback)."""
    return not line.startswith("{") or any(
        f'"level": "{level}"' in line for level in ("warning", "error", "critical"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
        item: pytest.Item) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed system test shows which of its processes had exited, and the end of each
    process's log: CI keeps nothing else."""
    report = yield
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if report.when != "call" or not report.failed or not isinstance(tmp, Path):
        return report
    exits = [line for running in RUNNING for line in running.exits()]
    if exits:
        report.sections.append(("processes exited", "\n".join(exits)))
    for log in sorted(tmp.rglob("*.log")):
        text = log.read_text(errors="replace").splitlines()
        notable = [line for line in text[:-LOG_TAIL_LINES] if _notable(line)]
        lines = notable[-LOG_TAIL_LINES:] + text[-LOG_TAIL_LINES:]
        report.sections.append((f"log tail: {log.relative_to(tmp)}",
                                "\n".join(line[:LOG_LINE_CHARS] for line in lines)))
    return report

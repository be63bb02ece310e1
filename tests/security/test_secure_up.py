"""`virtbus up --secure` for real: TLS, one NATS identity per process, the JetStream assets in
an account of their own and people and node agents in another (`events.authorization.accounts`).
The operator applies a VM and sees it run and its history, and neither the server nor any
process `up` started saw a permission refused: every process works under the split."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import suppress
from pathlib import Path

import aiohttp
import msgspec
import pytest
import yaml

from controlplane.context import Context
from controlplane.secured import HTTP_TOKENS, OPERATOR_USER, SECURE_DIR
from controlplane.user.client import Client
from events.jetstream.connect import CA_ENV, CREDENTIALS_ENV, NATS_URL_ENV
from events.jetstream.server import free_port
from tests.system.harness import eventually, ready_nodes, vm_status, vmi_phase

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vm-cirros.yaml"
REFUSED = "violation"
"""What the server logs (`Publish Violation`, `Subscription Violation`) and a process logs
(`permissions violation`) when a permission refuses something."""


class SecureUp:
    def __init__(self, data_dir: Path, context: Path, http_port: int) -> None:
        self.data_dir, self.context_path, self.http_port = data_dir, context, http_port

    def context(self) -> Context | None:
        if not self.context_path.exists():
            return None
        return msgspec.json.decode(self.context_path.read_bytes(), type=Context)

    def refusals(self) -> list[str]:
        """Every log line, the server's and each child's, that tells of a refusal."""
        logs = [self.data_dir / "nats" / "nats-server.log",
                *sorted((self.data_dir / "logs").glob("*.log"))]
        return [f"{log.name}: {line}" for log in logs
                for line in log.read_text(errors="replace").splitlines()
                if REFUSED in line.lower()]


@pytest.fixture
def secure_up(tmp_path: Path) -> Iterator[SecureUp]:
    """`virtbus up --secure` in its own process group, stopped as a person stops it."""
    context = tmp_path / "context.json"
    env = {**os.environ, "VIRTBUS_CONTEXT": str(context)}
    for name in (NATS_URL_ENV, CREDENTIALS_ENV, CA_ENV):
        env.pop(name, None)
    http_port = free_port()
    up = subprocess.Popen([sys.executable, "-m", "controlplane.user.cli", "up", "--secure",
                           "--data-dir", str(tmp_path / "data"), "--nodes", "2",
                           "--http-port", str(http_port)], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True)
    try:
        yield SecureUp(tmp_path / "data", context, http_port)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        finally:
            with suppress(ProcessLookupError):  # anything of `up`'s still there goes too
                os.killpg(up.pid, signal.SIGKILL)
            up.wait()


@pytest.fixture
async def operator(secure_up: SecureUp) -> AsyncIterator[Client]:
    async def written() -> Context | None:
        return secure_up.context()

    context = await eventually(written, what="`virtbus up --secure` up")
    assert context.credentials and context.ca, context  # TLS and an identity, not open
    client = await Client.connect(context.access, context.prefix)
    try:
        yield client
    finally:
        await client.close()


async def test_a_vm_runs_under_the_split_accounts(secure_up: SecureUp,
                                                  operator: Client) -> None:
    assert operator.actor == OPERATOR_USER  # who logs in is who acts
    await eventually(lambda: ready_nodes(operator, 2), what="two Ready nodes")
    manifest = yaml.safe_load(EXAMPLE.read_text())
    name, namespace = manifest["metadata"]["name"], "default"  # the manifest names none
    [outcome] = await operator.apply(manifest)
    assert outcome.accepted, outcome.reason

    await eventually(lambda: vm_status(operator, name, "Running", namespace),
                     what="the VM Running")
    vmi = await eventually(lambda: vmi_phase(operator, name, "Running", namespace),
                           what="its VMI Running")
    assert vmi["status"]["nodeName"] in {"node-1", "node-2"}
    history = await operator.history("VirtualMachine", namespace, name)
    assert history[0].type == "VirtualMachineCreated"
    assert history[0].actor == OPERATOR_USER
    assert history[0].command_id == outcome.command_id
    assert history[0].sequence in outcome.sequences

    # The HTTP API: the operator's bearer token (made by `up`) reads everything and the
    # metrics; without a token, nothing (the policy grants anonymous nothing).
    [token] = [row[0] for row in csv.reader((secure_up.data_dir / SECURE_DIR / HTTP_TOKENS)
                                            .read_text().splitlines()) if row[1] == OPERATOR_USER]
    base = f"http://127.0.0.1:{secure_up.http_port}"
    async with aiohttp.ClientSession() as session:
        for path, anonymous in ((f"/apis/kubevirt.io/v1/namespaces/{namespace}/"
                                 f"virtualmachines/{name}", 404), ("/metrics", 403)):
            async with session.get(base + path,
                                   headers={"Authorization": f"Bearer {token}"}) as response:
                assert response.status == 200, path
            async with session.get(base + path) as response:
                assert response.status == anonymous, path

    assert secure_up.refusals() == []

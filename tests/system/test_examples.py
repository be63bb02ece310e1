"""The examples run against a live system and say what they claim."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from controlplane.client import Client
from tests.system.harness import System, eventually, vm_manifest, vmi_phase

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def test_audit_example_prints_history_and_past_state(system: System, vb: Client) -> None:
    await vb.apply(vm_manifest("audited"))
    await eventually(lambda: vmi_phase(vb, "audited", "Running"), what="VM running")
    running_at = datetime.now(UTC)
    await vb.act("VirtualMachine", "stop", "default", "audited")
    env = {**os.environ, "VIRTBUS_NATS_URL": system.nats_url, "VIRTBUS_PREFIX": system.prefix}
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(EXAMPLES / "audit.py"), "audited",
                         running_at.isoformat()],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "user:alice VirtualMachineCreated" in lines[0]
    assert "user:alice VirtualMachineRunStrategyChanged" in lines[1]
    assert lines[-1].endswith(": Running, runStrategy Always")

"""An audit with the Python client: who changed a VM, and what it looked like at a moment.

    python examples/audit.py testvm                 # its history
    python examples/audit.py testvm 2026-11-21T10:02:00Z   # ...and its state at 10:02

Reads the same context as the CLI (`VIRTBUS_NATS_URL`, or the file `virtbus up` wrote).
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime

from controlplane.context import resolve
from controlplane.user.client import Client


async def audit(name: str, at: datetime | None, namespace: str = "default") -> None:
    ctx = resolve()
    async with await Client.connect(ctx.nats_url, ctx.prefix) as vb:
        for entry in await vb.history("VirtualMachine", namespace, name):
            changed = ", ".join(sorted({c["path"] for c in entry.changes})) or "-"
            print(f"#{entry.sequence} {entry.time} {entry.actor} {entry.type} "
                  f"(command {entry.command_id}): {changed}")
        if at is not None:
            found = await vb.query_at(at, "VirtualMachine", namespace, name)
            vm = found[0] if found else None
            state = vm["status"]["printableStatus"] if vm else "did not exist"
            strategy = vm["spec"].get("runStrategy", "-") if vm else "-"
            print(f"at {at.isoformat()}: {state}, runStrategy {strategy}")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    at = datetime.fromisoformat(argv[1]) if len(argv) > 1 else None
    if at is not None and at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    asyncio.run(audit(argv[0], at))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

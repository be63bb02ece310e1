"""The control-plane process: intake, the control loop and the writer, until stopped."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import structlog

from controlplane.defaults import NODE_MONITOR_GRACE_SECONDS
from controlplane.intake import CommandIntake, ReportIntake
from controlplane.lease import Lease
from controlplane.loop import ControlLoop
from controlplane.writer import Writer
from events.api.resources import load_quantity_parser
from events.authorization.policy import Policy
from events.jetstream.connect import Access, connect_unless_stopped, shown
from events.jetstream.streams import ensure_all
from events.language.subjects import Layout
from events.runtime.aio import report_loop_errors, together, unless_stopped
from events.runtime.collector import tune_for_service

log = structlog.get_logger(__name__)

DEFAULT_HOLDER = os.environ.get("VIRTBUS_REPLICA", "") or socket.gethostname()
"""This replica's name in the lease: stable across its own restarts."""


async def serve(access: Access | str, layout: Layout, *, replicas: int = 1,
                node_grace_seconds: float = NODE_MONITOR_GRACE_SECONDS,
                holder: str = DEFAULT_HOLDER, stop: asyncio.Event | None = None,
                policy: Policy | None = None) -> bool:
    """Lead (once the lease is ours) until `stop`; False if the lease was lost instead."""
    stop = stop or asyncio.Event()
    load_quantity_parser()  # now, not on the loop of the first decision after a takeover
    access = access if isinstance(access, Access) else Access(access)
    nc = await connect_unless_stopped(access, f"{layout.prefix}-controlplane", stop)
    if nc is None:
        return True
    try:
        if not await unless_stopped(ensure_all(nc.jetstream(), layout, replicas), stop):
            return True
        lease = Lease(nc, layout, holder)
        if not await lease.acquire(stop):
            return True
        lost = asyncio.Event()
        halt = asyncio.Event()

        async def halt_on(event: asyncio.Event) -> None:
            await event.wait()
            halt.set()

        writer = Writer(nc, layout)
        loop = ControlLoop(nc, layout, writer, node_grace_seconds)
        log.info("control plane started", nats_url=shown(access.url), prefix=layout.prefix,
                 authorization="policy" if policy is not None and policy.enforced else "open")
        watchers = [asyncio.ensure_future(halt_on(e)) for e in (stop, lost)]
        try:
            await together(
                CommandIntake(nc, layout, writer, policy, ready=loop.live).run(halt),
                ReportIntake(nc, layout, writer, ready=loop.live).run(halt),
                loop.run(halt),
                lease.hold(halt, lost),
            )
        finally:
            for w in watchers:  # also when a part failed: no task left pending at loop close
                w.cancel()
        return not lost.is_set()
    finally:
        await nc.close()


def run(access: Access, layout: Layout, **kwargs: object) -> int:
    """The process: exit status 1 when the lease was lost, so a supervisor restarts it."""

    async def main() -> bool:
        stop = asyncio.Event()
        running = asyncio.get_running_loop()
        report_loop_errors(running)
        for sig in (signal.SIGTERM, signal.SIGINT):
            running.add_signal_handler(sig, stop.set)
        return await serve(access, layout, stop=stop, **kwargs)  # type: ignore[arg-type]

    tune_for_service()
    return 0 if asyncio.run(main()) else 1

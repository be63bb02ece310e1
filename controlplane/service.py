"""The control-plane process: intake, the control loop and the writer, until stopped."""

from __future__ import annotations

import asyncio
import signal

import structlog

from controlplane.defaults import NODE_MONITOR_GRACE_SECONDS
from controlplane.intake import CommandIntake, ReportIntake
from controlplane.loop import ControlLoop
from controlplane.writer import Writer
from events.connect import connect
from events.streams import ensure_all
from events.subjects import Layout

log = structlog.get_logger(__name__)


async def serve(nats_url: str, layout: Layout, *, replicas: int = 1,
                node_grace_seconds: float = NODE_MONITOR_GRACE_SECONDS,
                stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    nc = await connect(nats_url, f"{layout.prefix}-controlplane")
    await ensure_all(nc.jetstream(), layout, replicas)
    writer = Writer(nats_url, layout)
    loop = ControlLoop(nc, layout, writer, node_grace_seconds)
    log.info("control plane started", nats_url=nats_url, prefix=layout.prefix)
    try:
        await asyncio.gather(
            CommandIntake(nc, layout, writer).run(stop),
            ReportIntake(nc, layout, writer).run(stop),
            loop.run(stop),
        )
    finally:
        writer.close()
        await nc.close()


def run(nats_url: str, layout: Layout, **kwargs: object) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await serve(nats_url, layout, stop=stop, **kwargs)  # type: ignore[arg-type]

    asyncio.run(main())

"""Small asyncio helpers every long-running loop uses."""

from __future__ import annotations

import asyncio
import contextlib


async def pause_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    """Wait `seconds` between rounds of a periodic loop, returning at once on `stop`."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)

"""The one bridge between the synchronous `eventsourcing` library and asyncio nats-py.

A daemon thread runs an event loop that owns one NATS connection; synchronous callers
submit coroutines and block on the result. Async callers already on a loop must not use
it from that loop's thread (they would deadlock); they talk to nats-py directly.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from nats.aio.client import Client

from events.jetstream.connect import connect

T = TypeVar("T")

DEFAULT_TIMEOUT = 120.0
"""Longer than any store call's own worst case (an append's attempts, each bounded by its ack
timeout), so the bridge gives up only on work that is truly stuck."""


class NatsBridge:
    """A NATS connection usable from any thread through `run()`."""

    def __init__(self, url: str, *, name: str = "virtbus") -> None:
        self.url = url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"nats-{name}",
                                        daemon=True)
        self._thread.start()
        self.nc: Client = self.run(connect(url, name, connect_timeout=5))

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    async def _shutdown(self) -> None:
        if not self.nc.is_closed:
            await self.nc.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = DEFAULT_TIMEOUT) -> T:
        """Run `coro` on the bridge's loop and wait for its result."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("NatsBridge.run() called from its own loop thread")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()  # what the caller abandons (a timeout, an interrupt) stops too
            raise

    def close(self) -> None:
        """Close the connection, cancel whatever callers still wait on, stop the loop."""
        if self._loop.is_closed():
            return
        self.run(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

"""libvirt lifecycle events, delivered as `Observation`s and used to wait without sleeping.

libvirt dispatches events from one loop per process, so `start_event_loop` runs it once in
a daemon thread; every watcher shares it. Callbacks therefore run on that thread: hand
observations to asyncio with `to_asyncio`, never block in `deliver`.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import libvirt
import structlog

from nodeagent.phases import Observation, StopCause

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable
    from types import TracebackType

log = structlog.get_logger(__name__)

_LOOP_LOCK = threading.Lock()
_LOOP_THREADS: list[threading.Thread] = []


def start_event_loop() -> None:
    """Register libvirt's default event loop and run it; later calls do nothing."""
    with _LOOP_LOCK:
        if _LOOP_THREADS:
            return
        libvirt.virEventRegisterDefaultImpl()
        thread = threading.Thread(target=_run_loop, name="libvirt-events", daemon=True)
        thread.start()
        _LOOP_THREADS.append(thread)


def _run_loop() -> None:
    while True:
        libvirt.virEventRunDefaultImpl()


def to_asyncio(
    loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Observation]
) -> Callable[[Observation], None]:
    """A `deliver` that moves observations from libvirt's thread onto an asyncio queue."""

    def deliver(observation: Observation) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, observation)

    return deliver


class LifecycleWatcher:
    """Watches one connection's domains; remembers why we stopped them until the event says so."""

    def __init__(
        self,
        conn: libvirt.virConnect,
        deliver: Callable[[Observation], None],
        *,
        node: str = "",
    ) -> None:
        start_event_loop()
        self._deliver = deliver
        self._conn = conn
        self._causes: dict[str, StopCause] = {}
        self._changed = threading.Condition()
        self._log = log.bind(node=node)
        self._callback_id: int = conn.domainEventRegisterAny(
            None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, self._on_event, None
        )

    def close(self) -> None:
        self._conn.domainEventDeregisterAny(self._callback_id)

    def __enter__(self) -> LifecycleWatcher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def expect(self, name: str, cause: StopCause) -> None:
        """Record why `name` is about to stop (or pause); the next event of that kind
        (`cause.ends_with`) carries this cause."""
        with self._changed:
            self._causes[name] = cause

    def forget(self, name: str) -> None:
        """Drop a recorded cause when the stop it announced did not happen."""
        with self._changed:
            self._causes.pop(name, None)

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Re-check `predicate` on every lifecycle event until true or `timeout` seconds pass."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def _on_event(
        self, _conn: libvirt.virConnect, dom: libvirt.virDomain, event: int, detail: int, _: None
    ) -> None:
        name = dom.name()
        with self._changed:
            expected = self._causes.get(name)
            ends = expected is not None and event == expected.ends_with
            cause = self._causes.pop(name) if ends else None
            self._changed.notify_all()
        observation = Observation(name, dom.UUIDString(), event, detail, cause)
        self._log.debug(
            "lifecycle", domain=name, lifecycle_event=event, detail=detail, cause=cause
        )
        try:
            self._deliver(observation)
        except Exception:
            self._log.exception("delivering a lifecycle observation failed", domain=name)

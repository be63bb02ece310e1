"""Building many objects at once (a snapshot's views, a list's rendering) without the cyclic
garbage collector: it runs every few hundred allocations and, each time it reaches its
oldest generation, walks every object the process holds, a whole read model included. Half
the time of decoding a 20,000-view snapshot went there; what these build holds no cycles
that must be freed meanwhile.

Scopes nest and overlap (a point-in-time read spans awaits and a worker thread while the
live loop decodes in another): the collector comes back when the last open scope closes,
and only if it was on when the first opened. A build that drops what it made before its
scope closes leaves the collector nothing to walk: the first collection after a scope
walks every container made within it that is still alive."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator


class _Scopes:
    """The open scopes, and whether the collector was on before the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = 0
        self.was_enabled = False


_scopes = _Scopes()


@contextlib.contextmanager
def uncollected() -> Iterator[None]:
    """No cyclic collection while any such scope is open."""
    with _scopes.lock:
        if _scopes.open == 0:
            _scopes.was_enabled = gc.isenabled()
            gc.disable()
        _scopes.open += 1
    try:
        yield
    finally:
        with _scopes.lock:
            _scopes.open -= 1
            if _scopes.open == 0 and _scopes.was_enabled:
                gc.enable()

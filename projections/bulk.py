"""Building many objects at once (a snapshot's views, a list's rendering) without the cyclic
garbage collector: it runs every few hundred allocations and, each time it reaches its
oldest generation, walks every object the process holds, a whole read model included. Half
the time of decoding a 20,000-view snapshot went there; what these build holds no cycles
that must be freed meanwhile."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def uncollected() -> Iterator[None]:
    """No cyclic collection within (synchronous code only: nothing else runs meanwhile)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

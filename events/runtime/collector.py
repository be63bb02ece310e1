"""CPython's cyclic garbage collector, set for a long-running service that holds a large
read model and handles many short-lived messages.

CPython collects its youngest generation once 700 more objects were made than freed, and
the middle one every 10 of those; what is alive then moves up a generation. So objects that
live a few milliseconds while the service is busy (a command in flight, its messages and
futures) reach the oldest generation; those in reference cycles die there, and each time a
quarter of the heap has moved up that way a full collection starts, walking the whole read
model with the event loop stopped. At 10,000 VMs the control plane ran one every ~2 s, each
0.1 to 0.4 s long: its largest controller lag, and about a tenth of its time. With the youngest
generation collected every `YOUNG_ALLOCATIONS` instead, what a command holds is dead before
it would move up, full collections become rare (one in a 10,000-VM run), and a young
collection walks at most that many objects (a few ms). What the collector frees stays the
same; only when changes.
"""

from __future__ import annotations

import gc
from typing import Final

YOUNG_ALLOCATIONS: Final = 50_000
"""Allocations (less deallocations) between two collections of the youngest generation
(CPython: 700)."""
MIDDLE_ROUNDS: Final = 5
"""Young collections between two collections of the middle generation (CPython: 10): it
holds what outlived a young collection, so it is walked before it grows large."""
OLD_ROUNDS: Final = 10
"""Middle collections before the oldest generation may be collected (CPython's)."""


def tune_for_service() -> None:
    """Set the collector's thresholds for this process (a service's start)."""
    gc.set_threshold(YOUNG_ALLOCATIONS, MIDDLE_ROUNDS, OLD_ROUNDS)

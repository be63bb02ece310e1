"""The collector's thresholds a service sets (`events.runtime.collector`):
what a message's handling
leaves behind for a moment is collected young, never by a full collection (each walks the
whole read model with the event loop stopped).

Counted in an interpreter of its own: whether a full collection starts depends on the size
of the heap, and the test run's grows with every test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHURN = """
import collections, gc, json, sys
from events.runtime.collector import tune_for_service

def churn():  # objects in reference cycles (a future and its callbacks, an exception and
    # its frame), each dropped once 2,000 more are made: garbage only a collection frees
    alive = collections.deque()
    for n in range(500_000):
        made = {"n": n}
        made["self"] = made
        alive.append(made)
        if len(alive) > 2_000:
            alive.popleft()

def full_collections(settle):
    settle()
    gc.collect()
    before = gc.get_stats()[2]["collections"]
    churn()
    return gc.get_stats()[2]["collections"] - before

json.dump({"untuned": full_collections(lambda: gc.set_threshold(700, 10, 10)),
           "tuned": full_collections(tune_for_service)}, sys.stdout)
"""


def test_short_lived_cycles_start_no_full_collection_once_tuned() -> None:
    counted = json.loads(subprocess.run([sys.executable, "-c", CHURN], cwd=ROOT, check=True,
                                        capture_output=True, text=True, timeout=120).stdout)
    assert counted["untuned"] > 0  # what a service pays with CPython's own thresholds
    assert counted["tuned"] == 0

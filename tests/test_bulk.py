"""`uncollected` scopes nest and overlap, across threads and awaits: the collector comes
back when the last open scope closes, only if it was on before the first, and whatever
order they close in."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from projections.bulk import uncollected


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_overlapping_scopes_keep_the_collector_off_until_the_last_closes() -> None:
    first, second = uncollected(), uncollected()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first closes while the second is still open
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_scope_in_another_thread_keeps_it_off_for_both() -> None:
    inside, leave = threading.Event(), threading.Event()

    def build() -> None:
        with uncollected():
            inside.set()
            leave.wait()

    worker = threading.Thread(target=build)
    with uncollected():
        worker.start()
        inside.wait()
    assert not gc.isenabled()  # the worker's scope is still open
    leave.set()
    worker.join()
    assert gc.isenabled()


def test_the_collector_stays_off_if_it_was_off() -> None:
    gc.disable()
    with uncollected():
        pass
    assert not gc.isenabled()


def test_a_failing_build_gives_the_collector_back() -> None:
    with pytest.raises(RuntimeError), uncollected():
        raise RuntimeError("build failed")
    assert gc.isenabled()

"""The simulated transfer (`nodeagent.migration`), stepped without a clock: pre-copy
converges when the link outruns the guest, is stuck (progress timeout) when it does not,
times out (completion timeout) or switches to post-copy and drains, and auto-converge
throttles a guest into converging where plain pre-copy is stuck."""

from __future__ import annotations

import msgspec

from nodeagent.migration import (
    COMPLETION_TIMEOUT,
    PROGRESS_TIMEOUT,
    QEMU_THROTTLE_INITIAL_PERCENT,
    QEMU_THROTTLE_MAX_PERCENT,
    Link,
    Transfer,
    advance,
    begin,
)

MiB = 1 << 20
STEP = 1.0


def run(link: Link, steps: int = 10_000) -> list[Transfer]:
    """Every state from the start until the transfer ends (or `steps` run out)."""
    seen = [begin(link)]
    while seen[-1].state == "running" and len(seen) <= steps:
        seen.append(advance(link, seen[-1], STEP))
    return seen


LINK = Link(memory=1024 * MiB, bandwidth=100 * MiB, dirty_rate=0, progress_timeout=150)


def test_an_idle_guest_converges_as_fast_as_the_link_sends_it() -> None:
    seen = run(LINK)
    assert [t.state for t in seen[-2:]] == ["running", "converged"]
    assert seen[-1].remaining <= LINK.switchover_bytes
    assert len(seen) - 1 == 10, "1 GiB less what fits the switch-over, at 100 MiB/s"
    assert seen[-1].processed == 1024 * MiB - seen[-1].remaining
    assert all(t.mode == "PreCopy" for t in seen)


def test_a_dirtying_guest_converges_slower_while_the_link_outruns_it() -> None:
    seen = run(msgspec.structs.replace(LINK, dirty_rate=60 * MiB))
    assert seen[-1].state == "converged"
    assert len(seen) - 1 == 25, "(1 GiB - 30 MiB) at 40 MiB/s net"
    assert seen[-1].processed > 1024 * MiB, "dirtied pages are sent again"


def test_a_small_guest_is_converged_before_anything_is_sent() -> None:
    small = begin(msgspec.structs.replace(LINK, memory=10 * MiB))
    assert (small.state, small.processed) == ("converged", 0)


def test_a_guest_dirtying_as_fast_as_the_link_is_stuck_and_times_out() -> None:
    link = msgspec.structs.replace(LINK, dirty_rate=100 * MiB, progress_timeout=5)
    seen = run(link)
    assert (seen[-1].state, seen[-1].reason) == ("failed", PROGRESS_TIMEOUT)
    assert seen[-1].elapsed - seen[-1].lowest_at > 5
    assert len(seen) - 1 == 6, "no new low since the start: failed once past 5 s"


def test_no_progress_timeout_when_it_is_zero() -> None:
    link = msgspec.structs.replace(LINK, dirty_rate=100 * MiB, progress_timeout=0)
    assert run(link, steps=500)[-1].state == "running"


def test_past_the_completion_timeout_without_post_copy_it_fails() -> None:
    link = msgspec.structs.replace(LINK, dirty_rate=90 * MiB, completion_timeout=20)
    seen = run(link)
    assert (seen[-1].state, seen[-1].reason) == ("failed", COMPLETION_TIMEOUT)
    assert seen[-1].elapsed == 21, "strictly past it, as KubeVirt counts"


def test_past_the_completion_timeout_post_copy_starts_and_drains() -> None:
    link = msgspec.structs.replace(LINK, dirty_rate=100 * MiB, progress_timeout=1000,
                                   completion_timeout=20, allow_post_copy=True)
    seen = run(link)
    switched = next(i for i, t in enumerate(seen) if t.mode == "PostCopy")
    assert seen[switched].elapsed == 21
    assert all(t.mode == "PreCopy" for t in seen[:switched])
    assert all(t.mode == "PostCopy" for t in seen[switched:])
    assert seen[-1].state == "converged"
    drained = [t.remaining for t in seen[switched:]]
    assert drained == sorted(drained, reverse=True), "nothing dirtied once in post-copy"


def test_post_copy_is_not_timed_out_however_slow() -> None:
    link = msgspec.structs.replace(LINK, bandwidth=1 * MiB, dirty_rate=1 * MiB,
                                   progress_timeout=5, completion_timeout=3,
                                   allow_post_copy=True)
    seen = run(link)
    assert seen[-1].state == "converged", "post-copy began before the stall was noticed"
    assert seen[-1].elapsed > 1000


def test_auto_converge_throttles_a_guest_that_plain_pre_copy_cannot_move() -> None:
    stuck = msgspec.structs.replace(LINK, dirty_rate=150 * MiB, progress_timeout=30)
    assert run(stuck)[-1].reason == PROGRESS_TIMEOUT
    seen = run(msgspec.structs.replace(stuck, allow_auto_converge=True))
    assert seen[-1].state == "converged"
    throttles = [t.throttle_percent for t in seen]
    assert throttles[1] == QEMU_THROTTLE_INITIAL_PERCENT
    assert throttles == sorted(throttles), "the throttle only tightens"
    assert throttles[2] - throttles[1] == 10


def test_the_throttle_stops_at_99_percent() -> None:
    link = msgspec.structs.replace(LINK, bandwidth=1 * MiB, dirty_rate=10_000 * MiB,
                                   progress_timeout=0, allow_auto_converge=True)
    assert run(link, steps=50)[-1].throttle_percent == QEMU_THROTTLE_MAX_PERCENT


def test_a_finished_transfer_does_not_move() -> None:
    done = run(LINK)[-1]
    assert advance(LINK, done, STEP) is done

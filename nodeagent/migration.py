"""A live migration's memory transfer as a step function over time, for the test driver.

libvirt's test driver cannot migrate, so a test-driver agent simulates the transfer it would
watch on a real hypervisor: `advance` moves a `Transfer` on by `dt` seconds, with no clock of
its own, so every outcome (converging, stuck, timed out, post-copy, auto-converge) is a unit
test away. The rules follow QEMU's pre-copy and KubeVirt's migration monitor
(`pkg/virt-launcher/virtwrap/live-migration-source.go`, the legacy convergence path):

- Pre-copy: every second `bandwidth` bytes go over and the guest dirties `dirty_rate` bytes
  again (never more than its memory), while there is anything left to send (a link faster
  than the guest sends each dirtied page as it comes). The transfer has converged once what
  remains fits in QEMU's default maximum downtime at that bandwidth: the switch-over can
  pause the guest for that long.
- Auto-converge: a period in which the guest dirtied more than half what was sent throttles
  its vCPUs, QEMU's `cpu-throttle-initial` (20 %) at first, then `cpu-throttle-increment`
  (10 %) more each such period, up to 99 %; the dirty rate shrinks with it.
- Progress timeout: no new low of the remaining data for `progress_timeout` seconds fails the
  transfer (KubeVirt's watermark; "stuck" in its log).
- Completion timeout: past `completion_timeout` seconds (when non-zero) the transfer switches
  to post-copy when allowed (the guest dirties no more; the rest drains at the bandwidth, and
  KubeVirt times nothing out any more), else fails.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from events.language.messages import MigrationMode

QEMU_DOWNTIME_LIMIT_SECONDS: Final = 0.3
"""QEMU's default `downtime-limit` (300 ms): how long the switch-over may pause the guest."""
QEMU_THROTTLE_INITIAL_PERCENT: Final = 20
QEMU_THROTTLE_INCREMENT_PERCENT: Final = 10
QEMU_THROTTLE_MAX_PERCENT: Final = 99
QEMU_THROTTLE_TRIGGER: Final = 0.5
"""QEMU throttles when a period's dirtied bytes exceed this share of the bytes it sent."""

PROGRESS_TIMEOUT: Final = "progress timeout"
COMPLETION_TIMEOUT: Final = "completion timeout"
SOURCE_LOST_DOMAIN_REASON: Final = "the source lost the domain"
"""Why a simulated transfer fails whose guest left its source meanwhile."""

TransferState = Literal["running", "converged", "failed"]


class Link(msgspec.Struct, frozen=True, kw_only=True):
    """What a transfer runs against: the guest, the link, and the migration's limits."""

    memory: int
    """The guest's memory in bytes: the data to send."""
    bandwidth: int
    """Bytes per second over the link (the lower of the link's and the migration's)."""
    dirty_rate: int
    """Bytes per second the guest writes to its memory while it runs."""
    progress_timeout: float
    completion_timeout: float = 0.0
    """0: none."""
    allow_post_copy: bool = False
    allow_auto_converge: bool = False

    @property
    def switchover_bytes(self) -> int:
        """What may remain when the guest is paused for the switch-over."""
        return int(self.bandwidth * QEMU_DOWNTIME_LIMIT_SECONDS)


class Transfer(msgspec.Struct, frozen=True, kw_only=True):
    """A transfer at one moment; `advance` gives the next."""

    elapsed: float = 0.0
    total: int
    """The guest's memory (libvirt's dataTotal)."""
    processed: int = 0
    """Bytes sent so far, pages sent again included."""
    remaining: int
    lowest: int
    """The lowest `remaining` seen: progress is a new low (KubeVirt's watermark)."""
    lowest_at: float = 0.0
    throttle_percent: int = 0
    mode: MigrationMode = "PreCopy"
    state: TransferState = "running"
    reason: str = ""


def begin(link: Link) -> Transfer:
    """A transfer with everything still to send (converged at once if that fits the
    switch-over, as an idle small guest does)."""
    start = Transfer(total=link.memory, remaining=link.memory, lowest=link.memory)
    return _converged(start) if link.memory <= link.switchover_bytes else start


def advance(link: Link, transfer: Transfer, dt: float) -> Transfer:
    """The transfer `dt` seconds later; a finished one stays as it is."""
    if transfer.state != "running" or dt <= 0:
        return transfer
    elapsed = transfer.elapsed + dt
    dirty_rate = 0.0 if transfer.mode == "PostCopy" else \
        link.dirty_rate * (100 - transfer.throttle_percent) / 100
    net = link.bandwidth - dirty_rate
    busy = min(dt, transfer.remaining / net) if net > 0 else dt
    sent, dirtied = int(link.bandwidth * busy), int(dirty_rate * busy)
    remaining = min(max(transfer.remaining - sent + dirtied, 0), link.memory)
    moved = measured(transfer, elapsed=elapsed, processed=transfer.processed + sent,
                     remaining=remaining)
    throttled = msgspec.structs.replace(
        moved, throttle_percent=_throttle(link, transfer.throttle_percent, sent, dirtied))
    return _judge(link, throttled)


def measured(transfer: Transfer, *, elapsed: float, processed: int, remaining: int) -> Transfer:
    """The transfer with new figures (simulated, or a real hypervisor's job statistics); a
    new low of the remaining data is progress (KubeVirt's watermark)."""
    lowest, lowest_at = (remaining, elapsed) if remaining < transfer.lowest \
        else (transfer.lowest, transfer.lowest_at)
    return msgspec.structs.replace(transfer, elapsed=elapsed, processed=processed,
                                   remaining=remaining, lowest=lowest, lowest_at=lowest_at)


def _throttle(link: Link, percent: int, sent: int, dirtied: int) -> int:
    """QEMU's auto-converge: throttle harder after a period the guest out-dirtied the link."""
    if not link.allow_auto_converge or dirtied <= sent * QEMU_THROTTLE_TRIGGER:
        return percent
    if percent == 0:
        return QEMU_THROTTLE_INITIAL_PERCENT
    return min(percent + QEMU_THROTTLE_INCREMENT_PERCENT, QEMU_THROTTLE_MAX_PERCENT)


def _judge(link: Link, transfer: Transfer) -> Transfer:
    """Converged once the rest fits the switch-over, else as the monitor judges."""
    if transfer.remaining <= link.switchover_bytes:
        return _converged(transfer)
    return monitor(transfer, progress_timeout=link.progress_timeout,
                   completion_timeout=link.completion_timeout,
                   allow_post_copy=link.allow_post_copy)


def monitor(transfer: Transfer, *, progress_timeout: float, completion_timeout: float,
            allow_post_copy: bool) -> Transfer:
    """KubeVirt's migration monitor, in its order: post-copy is left alone; past the
    completion timeout (when non-zero) post-copy starts when allowed; stuck (no new low for
    the progress timeout, when non-zero) fails; past the completion timeout otherwise fails.
    The simulation and a real hypervisor's transfer (`nodeagent.livemigration`) both obey it."""
    if transfer.mode == "PostCopy":
        return transfer
    timed_out = 0 < completion_timeout < transfer.elapsed
    if timed_out and allow_post_copy:
        return msgspec.structs.replace(transfer, mode="PostCopy")
    if transfer.elapsed - transfer.lowest_at > progress_timeout > 0:
        return msgspec.structs.replace(transfer, state="failed", reason=PROGRESS_TIMEOUT)
    if timed_out:
        return msgspec.structs.replace(transfer, state="failed", reason=COMPLETION_TIMEOUT)
    return transfer


def _converged(transfer: Transfer) -> Transfer:
    return msgspec.structs.replace(transfer, state="converged")

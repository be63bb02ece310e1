"""`<clock>`: guest time offset and timers, mapped as KubeVirt's converter maps them.

| spec timer | libvirt timer | attributes            |
|------------|---------------|-----------------------|
| rtc        | rtc           | tickpolicy, track     |
| pit        | pit           | tickpolicy            |
| kvm        | kvmclock      |                       |
| hpet       | hpet          | tickpolicy            |
| hyperv     | hypervclock   |                       |

Every timer gets `present`, yes unless the spec says `present: false`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from events.api.domain import RTCTimer, TickTimer
from nodeagent.converter.xmltree import sub, yes_no

if TYPE_CHECKING:
    from events.api.domain import Clock, PresenceTimer
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def configure_clock(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    source = spec.domain.clock
    if source is None:
        return
    clock = sub(domain, "clock", **_offset(source))
    timer = source.timer
    if timer is None:
        return
    timers: tuple[tuple[str, RTCTimer | TickTimer | PresenceTimer | None], ...] = (
        ("rtc", timer.rtc),
        ("pit", timer.pit),
        ("kvmclock", timer.kvm),
        ("hpet", timer.hpet),
        ("hypervclock", timer.hyperv),
    )
    for name, spec_timer in timers:
        if spec_timer is not None:
            sub(clock, "timer", name=name, **_timer_attributes(spec_timer))


def _offset(source: Clock) -> dict[str, str]:
    """UTC resets to the host clock unless `offsetSeconds` shifts it (KubeVirt)."""
    if source.utc is not None:
        offset = source.utc.offset_seconds
        return {"offset": "utc", "adjustment": "reset" if offset is None else str(offset)}
    if source.timezone is not None:
        return {"offset": "timezone", "timezone": source.timezone}
    return {}


def _timer_attributes(timer: RTCTimer | TickTimer | PresenceTimer) -> dict[str, str]:
    attributes = {"present": yes_no(timer.present, default=True)}
    if isinstance(timer, RTCTimer | TickTimer) and timer.tick_policy:
        attributes["tickpolicy"] = timer.tick_policy
    if isinstance(timer, RTCTimer) and timer.track:
        attributes["track"] = timer.track
    return attributes

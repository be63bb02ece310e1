"""HCO's metrics and alerts as a pure fold over the event log.

The controller's revert events and the HyperConverged's annotation changes are folded in
with their own timestamps; `alerts(now)` and `exposition()` read the state. Nothing here
reads a clock, so replaying the log rebuilds the same counters and the same alerts.

| alert                      | severity | labels          | firing                              |
|----------------------------|----------|-----------------|-------------------------------------|
| KubeVirtCRModified         | warning  | component_name  | from a revert until 10 minutes      |
|                            |          |                 | after that component's last revert  |
| UnsupportedHCOModification | info     | annotation_name | while the annotation holds patches  |

Beside HCO's, the exposition carries the reader's own `virtbus_events_skipped_total{reason}`:
the messages of the log this version could not decode (`projections.follower`), folded
with the rest, so it too is the same after a replay.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

OUT_OF_BAND_MODIFICATIONS: Final = "kubevirt_hco_out_of_band_modifications_total"
UNSAFE_MODIFICATIONS: Final = "kubevirt_hco_unsafe_modifications"
COMPONENT_LABEL: Final = "component_name"
ANNOTATION_LABEL: Final = "annotation_name"

CR_MODIFIED_ALERT: Final = "KubeVirtCRModified"
CR_MODIFIED_SEVERITY: Final = "warning"
CR_MODIFIED_WINDOW: Final = timedelta(minutes=10)
UNSUPPORTED_MODIFICATION_ALERT: Final = "UnsupportedHCOModification"
UNSUPPORTED_MODIFICATION_SEVERITY: Final = "info"

OUT_OF_BAND_HELP: Final = "Count of out-of-band modifications overwritten by HCO"
UNSAFE_HELP: Final = "Count of unsafe modifications in the HyperConverged annotations"

EVENTS_SKIPPED: Final = "virtbus_events_skipped_total"
REASON_LABEL: Final = "reason"
EVENTS_SKIPPED_HELP: Final = "Messages of the event log this version could not decode, skipped"


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str
    labels: dict[str, str]
    active_since: datetime


@dataclass
class _Reverts:
    count: int = 0
    last: datetime | None = None
    since: datetime | None = None


@dataclass
class HcoMetrics:
    """The fold state: revert counters per component, unsafe patches per annotation."""

    _reverts: dict[str, _Reverts] = field(default_factory=dict)
    _unsafe: dict[str, int] = field(default_factory=dict)
    _unsafe_since: dict[str, datetime] = field(default_factory=dict)
    _skipped: dict[str, int] = field(default_factory=dict)

    def on_skipped(self, reason: str, count: int = 1) -> None:
        """`count` messages of the log skipped as undecodable, for `reason`."""
        self._skipped[reason] = self._skipped.get(reason, 0) + count

    def on_revert(self, component: str, at: datetime) -> None:
        """HCO overwrote an out-of-band modification of `component` (the operand's name)."""
        state = self._reverts.setdefault(component, _Reverts())
        if state.last is None or at - state.last >= CR_MODIFIED_WINDOW:
            state.since = at
        state.count += 1
        state.last = at

    def on_annotations(self, counts: Mapping[str, int], at: datetime) -> None:
        """The jsonpatch annotations now on the HyperConverged, with their operation counts.

        An annotation seen before and now absent drops to 0.
        """
        for name in self._unsafe.keys() - counts.keys():
            self._unsafe[name] = 0
        for name, count in counts.items():
            if count > 0 and self._unsafe.get(name, 0) == 0:
                self._unsafe_since[name] = at
            self._unsafe[name] = count

    def alerts(self, now: datetime) -> list[Alert]:
        """The alerts firing at `now`, per the table in the module docstring."""
        firing = [
            Alert(
                name=CR_MODIFIED_ALERT,
                severity=CR_MODIFIED_SEVERITY,
                labels={COMPONENT_LABEL: component},
                active_since=state.since,
            )
            for component, state in sorted(self._reverts.items())
            if state.last is not None
            and state.since is not None
            and state.last <= now < state.last + CR_MODIFIED_WINDOW
        ]
        firing.extend(
            Alert(
                name=UNSUPPORTED_MODIFICATION_ALERT,
                severity=UNSUPPORTED_MODIFICATION_SEVERITY,
                labels={ANNOTATION_LABEL: name},
                active_since=self._unsafe_since[name],
            )
            for name, count in sorted(self._unsafe.items())
            if count > 0 and self._unsafe_since[name] <= now
        )
        return firing

    def exposition(self) -> bytes:
        """The Prometheus text format of the current state."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_StateCollector(self))
        return generate_latest(registry)


class _StateCollector(Collector):
    def __init__(self, metrics: HcoMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        reverts = CounterMetricFamily(
            OUT_OF_BAND_MODIFICATIONS, OUT_OF_BAND_HELP, labels=[COMPONENT_LABEL]
        )
        for component, state in sorted(self._metrics._reverts.items()):
            reverts.add_metric([component], state.count)
        yield reverts
        unsafe = GaugeMetricFamily(UNSAFE_MODIFICATIONS, UNSAFE_HELP, labels=[ANNOTATION_LABEL])
        for name, count in sorted(self._metrics._unsafe.items()):
            unsafe.add_metric([name], count)
        yield unsafe
        skipped = CounterMetricFamily(EVENTS_SKIPPED, EVENTS_SKIPPED_HELP, labels=[REASON_LABEL])
        for reason, count in sorted(self._metrics._skipped.items()):
            skipped.add_metric([reason], count)
        yield skipped

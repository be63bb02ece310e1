"""KubeVirt's migration metrics as functions of the log: gauges of migrations per phase,
each migration's outcome and data, and the transition times from creation; evacuations
counted. Read from the folded views, with the events' own timestamps, so a replay gives the
same exposition."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from projections.kinds.migration import MigrationView

PHASE_GAUGES: Final = {
    "Pending": ("kubevirt_vmi_migrations_in_pending_phase",
                "Number of current pending migrations."),
    "Scheduling": ("kubevirt_vmi_migrations_in_scheduling_phase",
                   "Number of current scheduling migrations."),
    "Running": ("kubevirt_vmi_migrations_in_running_phase",
                "Number of current running migrations."),
}
"""KubeVirt counts Scheduled, PreparingTarget and TargetReady as scheduling."""
SCHEDULING_PHASES: Final = frozenset({"Scheduling", "Scheduled", "PreparingTarget",
                                      "TargetReady"})
PER_MIGRATION: Final = (
    ("kubevirt_vmi_migration_succeeded", "Indicates if the VMI migration succeeded."),
    ("kubevirt_vmi_migration_failed", "Indicates if the VMI migration failed."),
    ("kubevirt_vmi_migration_data_total_bytes",
     "The total Guest OS data to be migrated to the new VM."),
    ("kubevirt_vmi_migration_data_processed_bytes",
     "The total Guest OS data processed and migrated to the new VM."),
    ("kubevirt_vmi_migration_data_remaining_bytes",
     "The remaining guest OS data to be migrated to the new VM."),
    ("kubevirt_vmi_migration_start_time_seconds", "The time at which the migration started."),
    ("kubevirt_vmi_migration_end_time_seconds", "The time at which the migration ended."),
)
TRANSITIONS: Final = "kubevirt_vmi_migration_phase_transition_time_from_creation_seconds"
TRANSITION_BUCKETS: Final = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 90.0,
                             120.0, 150.0, 180.0, 240.0, 300.0, 600.0, 900.0, 1200.0, 1800.0,
                             2400.0, 3000.0, 3600.0)
EVACUATIONS: Final = "virtbus_vmi_evacuation_migrations_total"
LABELS: Final = ["vmi", "vmim", "namespace"]


def _phase_gauge(phase: str) -> str:
    return "Scheduling" if phase in SCHEDULING_PHASES else phase


class MigrationCollector(Collector):
    def __init__(self, migrations: list[MigrationView]) -> None:
        self.migrations = sorted(migrations, key=lambda m: m.id)

    def collect(self) -> Iterator[Metric]:
        live = [m for m in self.migrations if m.exists]
        for phase, (name, help_text) in PHASE_GAUGES.items():
            yield GaugeMetricFamily(name, help_text,
                                    value=sum(_phase_gauge(m.phase) == phase for m in live))
        per = {name: GaugeMetricFamily(name, help_text, labels=LABELS)
               for name, help_text in PER_MIGRATION}
        transitions = HistogramMetricFamily(
            TRANSITIONS, "Histogram of VM migration phase transitions duration from creation "
            "time in seconds.", labels=["phase"])
        by_phase: dict[str, list[float]] = {}
        for m in live:
            labels = [m.vmi_name, m.metadata.name, m.metadata.namespace]
            times = dict(m.transitions)
            values = {
                "kubevirt_vmi_migration_succeeded": float(m.phase == "Succeeded"),
                "kubevirt_vmi_migration_failed": float(m.phase == "Failed"),
                "kubevirt_vmi_migration_data_total_bytes": float(m.data_total),
                "kubevirt_vmi_migration_data_processed_bytes": float(m.data_processed),
                "kubevirt_vmi_migration_data_remaining_bytes": float(m.data_remaining),
            }
            if "Running" in times:
                values["kubevirt_vmi_migration_start_time_seconds"] = \
                    times["Running"].timestamp()
            end = times.get("Succeeded") or times.get("Failed")
            if end is not None:
                values["kubevirt_vmi_migration_end_time_seconds"] = end.timestamp()
            for name, value in values.items():
                per[name].add_metric(labels, value)
            if m.created_at is not None:
                for phase, at in m.transitions:
                    by_phase.setdefault(phase, []).append(
                        (at - m.created_at).total_seconds())
        yield from per.values()
        for phase, seconds in sorted(by_phase.items()):
            buckets = [(str(b), float(sum(s <= b for s in seconds)))
                       for b in TRANSITION_BUCKETS]
            transitions.add_metric([phase], [*buckets, ("+Inf", float(len(seconds)))],
                                   sum_value=sum(seconds))
        yield transitions
        yield CounterMetricFamily(
            EVACUATIONS, "Migrations a drain made to evacuate VMIs, created since the start.",
            value=sum(m.priority == "evacuation" for m in self.migrations))


def exposition(migrations: list[MigrationView]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MigrationCollector(migrations))
    return generate_latest(registry)

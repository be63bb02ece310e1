"""KubeVirt's eviction metrics as functions of the log: which VMI a drain cannot move, and
how many VMIs an upgrade left outdated (virt-controller's `vmistats_collector.go` and its
workload-updater's gauge). The count of evacuation migrations is `migration_metrics`'.

| metric                            | type  | labels               | value                    |
|-----------------------------------|-------|----------------------|--------------------------|
| kubevirt_vmi_non_evictable        | gauge | node, namespace,     | 1 when the VMI's eviction|
|                                   |       | name (every VMI)     | strategy is LiveMigrate  |
|                                   |       |                      | and it cannot live-      |
|                                   |       |                      | migrate, else 0          |
| kubevirt_vmi_number_of_outdated   | gauge |                      | VMIs running under an    |
|                                   |       |                      | older agent than their   |
|                                   |       |                      | node's                   |

KubeVirt's `VMIMigratableOnEviction` also takes LiveMigrateIfPossible, but only for a VMI
that is migratable, whose `LiveMigratable` condition then makes it 0: the same rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from projections.cluster import ClusterState, outdated_launcher
from projections.eviction import blocked_reason

NON_EVICTABLE: Final = "kubevirt_vmi_non_evictable"
OUTDATED: Final = "kubevirt_vmi_number_of_outdated"


class EvictionCollector(Collector):
    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        vmis = sorted(self.state.vmis(), key=lambda v: v.id)
        blockers = GaugeMetricFamily(
            NON_EVICTABLE, "Indication for a VirtualMachine that its eviction strategy is set "
            "to Live Migration but is not migratable.", labels=["node", "namespace", "name"])
        for vmi in vmis:
            blockers.add_metric([vmi.node, vmi.metadata.namespace, vmi.metadata.name],
                                float(bool(blocked_reason(self.state, vmi))))
        yield blockers
        yield GaugeMetricFamily(
            OUTDATED, "Indication for the total number of VirtualMachineInstance workloads "
            "that are not running within the most up-to-date version of the virt-launcher "
            "environment.", value=sum(outdated_launcher(self.state, v) for v in vmis))


def exposition(state: ClusterState) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EvictionCollector(state))
    return generate_latest(registry)

"""KubeVirt's VM and VMI metrics (virt-controller's `vmstats_collector.go` and
`vmistats_collector.go`, virt-api's creation counter, and the `kubevirt_vmi_phase_count`
recording rule), as a pure function of the read model: nothing here reads a clock, so a
replay of the log gives the same text.

| metric                                                     | type    | labels            |
|------------------------------------------------------------|---------|-------------------|
| kubevirt_vmi_info                                          | gauge 1 | node, namespace,  |
|                                                            |         | name, phase, os,  |
|                                                            |         | workload, flavor, |
|                                                            |         | instance_type,    |
|                                                            |         | preference,       |
|                                                            |         | guest_os_*,       |
|                                                            |         | evictable,        |
|                                                            |         | outdated, vmi_pod |
| kubevirt_vmi_phase_count (node:kubevirt_vmi_phase:sum)     | gauge   | kubevirt_vmi_info |
|                                                            |         | summed by node,   |
|                                                            |         | phase, os, ...    |
| kubevirt_vm_info                                           | gauge 1 | name, namespace,  |
|                                                            |         | os, workload,     |
|                                                            |         | flavor,           |
|                                                            |         | machine_type,     |
|                                                            |         | instance_type,    |
|                                                            |         | preference,       |
|                                                            |         | status,           |
|                                                            |         | status_group      |
| kubevirt_vm_{starting,running,migrating,non_running,error} | counter | name, namespace   |
| _status_last_transition_timestamp_seconds                  |         |                   |
| kubevirt_vm_create_date_timestamp_seconds                  | gauge   | name, namespace   |
| kubevirt_vm_created_total (sum of ..._created_by_pod_total)| counter | namespace         |

A label KubeVirt leaves out when empty is written empty (Prometheus reads both alike).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from events.api.vm import VirtualMachineSpec
from projections.cluster import ClusterState, render_vm
from projections.hco import operand
from projections.kinds.vm import VirtualMachineInstanceView, VirtualMachineView

VMI_INFO: Final = "kubevirt_vmi_info"
VMI_PHASE_COUNT: Final = "kubevirt_vmi_phase_count"
VM_INFO: Final = "kubevirt_vm_info"
VM_CREATE_DATE: Final = "kubevirt_vm_create_date_timestamp_seconds"
VM_CREATED: Final = "kubevirt_vm_created"
"""A counter: Prometheus adds `_total`."""

ANNOTATION_PREFIX: Final = "vm.kubevirt.io/"
OTHER: Final = "<other>"
"""What KubeVirt reports for an instancetype or preference it finds in no store of a
whitelisted vendor (virtbus has none yet)."""
INSTANCETYPE_ANNOTATIONS: Final = ("kubevirt.io/instancetype-name",
                                   "kubevirt.io/cluster-instancetype-name")
PREFERENCE_ANNOTATIONS: Final = ("kubevirt.io/preference-name",
                                 "kubevirt.io/cluster-preference-name")

VMI_INFO_LABELS: Final = ("node", "namespace", "name", "phase", "os", "workload", "flavor",
                          "instance_type", "preference", "guest_os_kernel_release",
                          "guest_os_machine", "guest_os_arch", "guest_os_name",
                          "guest_os_version_id", "evictable", "outdated", "vmi_pod")
PHASE_COUNT_LABELS: Final = ("node", "phase", "os", "workload", "flavor", "instance_type",
                             "preference", "guest_os_kernel_release", "guest_os_machine",
                             "guest_os_arch", "guest_os_name", "guest_os_version_id")
VM_INFO_LABELS: Final = ("name", "namespace", "os", "workload", "flavor", "machine_type",
                         "instance_type", "preference", "status", "status_group")

STATUS_GROUPS: Final = {
    "starting": ("Provisioning", "Starting", "WaitingForVolumeBinding"),
    "running": ("Running",),
    "migrating": ("Migrating",),
    "non_running": ("Stopped", "Paused", "Stopping", "Terminating"),
    "error": ("CrashLoopBackOff", "Unknown", "ErrorUnschedulable", "ErrImagePull",
              "ImagePullBackOff", "ErrorPvcNotFound", "DataVolumeError"),
}
"""KubeVirt's printableStatus groups, each with its last-transition counter."""
TRANSITION_CONDITIONS: Final = ("Ready", "Failure", "Paused")
"""The VM conditions whose newest lastTransitionTime dates the current status."""


def _system_info(annotations: dict[str, str]) -> tuple[str, str, str]:
    """The os, workload and flavor a template's `vm.kubevirt.io/` annotations name."""
    os_, workload, flavor = (annotations.get(ANNOTATION_PREFIX + key, "")
                             for key in ("os", "workload", "flavor"))
    return os_, workload, flavor


def _named(annotations: dict[str, str], keys: tuple[str, ...]) -> str:
    return OTHER if any(key in annotations for key in keys) else ""


def _status_group(status: str) -> str:
    return next((g for g, statuses in STATUS_GROUPS.items() if status in statuses),
                "<unknown>")


def _unix(at: str) -> float:
    """A rendered `lastTransitionTime` as Unix seconds (-1 when unset, as KubeVirt starts)."""
    if not at:
        return -1.0
    return datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _cluster_eviction_strategy(state: ClusterState) -> str:
    kubevirt = operand(state, "KubeVirt")
    config: Any = kubevirt.object.get("spec", {}).get("configuration", {}) if kubevirt else {}
    return str(config.get("evictionStrategy", "")) if isinstance(config, dict) else ""


def vmi_info(vmi: VirtualMachineInstanceView, cluster_eviction: str) -> tuple[str, ...]:
    """kubevirt_vmi_info's labels. Evictable unless eviction means live migration, which
    needs an IsMigratable condition virtbus never sets."""
    annotations = dict(vmi.metadata.annotations)
    strategy = (vmi.spec.eviction_strategy if vmi.spec is not None else None) \
        or cluster_eviction
    return (vmi.node, vmi.metadata.namespace, vmi.metadata.name, vmi.phase.lower(),
            *_system_info(annotations), _named(annotations, INSTANCETYPE_ANNOTATIONS),
            _named(annotations, PREFERENCE_ANNOTATIONS), "", "", "", "", "",
            str(strategy != "LiveMigrate").lower(), "false", "")


def vm_info(vm: VirtualMachineView, status: str) -> tuple[str, ...]:
    spec: VirtualMachineSpec | None = vm.spec
    annotations: dict[str, str] = dict(spec.template.metadata.annotations) if spec else {}
    machine = spec.template.spec.domain.machine if spec else None
    return (vm.metadata.name, vm.metadata.namespace, *_system_info(annotations),
            machine.type if machine is not None and machine.type else "",
            OTHER if spec is not None and spec.instancetype else "",
            OTHER if spec is not None and spec.preference else "",
            status.lower(), _status_group(status))


class VmMetrics(Collector):
    """The VM and VMI metrics of one read model."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        state = self.state
        eviction = _cluster_eviction_strategy(state)
        info = GaugeMetricFamily(VMI_INFO, "Information about VirtualMachineInstances.",
                                 labels=VMI_INFO_LABELS)
        phases: Counter[tuple[str, ...]] = Counter()
        for vmi in sorted(state.vmis(), key=lambda v: v.id):
            labels = vmi_info(vmi, eviction)
            info.add_metric(labels, 1)
            by_label = dict(zip(VMI_INFO_LABELS, labels, strict=True))
            phases[tuple(by_label[k] for k in PHASE_COUNT_LABELS)] += 1
        yield info
        phase_count = GaugeMetricFamily(
            VMI_PHASE_COUNT, "[Deprecated] Replaced by node:kubevirt_vmi_phase:sum.",
            labels=PHASE_COUNT_LABELS)
        for labels, count in sorted(phases.items()):
            phase_count.add_metric(labels, count)
        yield phase_count
        yield from self._vms()

    def _vms(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        state = self.state
        vm_info_family = GaugeMetricFamily(VM_INFO, "Information about Virtual Machines.",
                                           labels=VM_INFO_LABELS)
        transitions = {group: CounterMetricFamily(
            f"kubevirt_vm_{group}_status_last_transition_timestamp_seconds",
            f"Virtual Machine last transition timestamp to {group} status.",
            labels=["name", "namespace"]) for group in STATUS_GROUPS}
        created_at = GaugeMetricFamily(VM_CREATE_DATE, "Virtual Machine creation timestamp.",
                                       labels=["name", "namespace"])
        for vm in sorted(state.vms(), key=lambda v: v.id):
            meta = vm.metadata
            rendered = render_vm(vm, state.vmi(meta.namespace, meta.name))["status"]
            status = str(rendered["printableStatus"])
            vm_info_family.add_metric(vm_info(vm, status), 1)
            last = max((_unix(c["lastTransitionTime"]) for c in rendered["conditions"]
                        if c["type"] in TRANSITION_CONDITIONS), default=-1.0)
            current = _status_group(status)
            for group, family in transitions.items():
                family.add_metric([meta.name, meta.namespace], last if group == current else 0)
            if vm.created_at is not None:
                created_at.add_metric([meta.name, meta.namespace], vm.created_at.timestamp())
        yield vm_info_family
        yield from transitions.values()
        yield created_at
        created = CounterMetricFamily(
            VM_CREATED, "The total number of VMs created by namespace, since install.",
            labels=["namespace"])
        per_namespace: Counter[str] = Counter()
        for view in state.views.values():
            if isinstance(view, VirtualMachineView):
                per_namespace[view.metadata.namespace] += view.creations
        for namespace, count in sorted(per_namespace.items()):
            created.add_metric([namespace], count)
        yield created


def exposition(state: ClusterState) -> bytes:
    """The Prometheus text of the VM and VMI metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(VmMetrics(state))
    return generate_latest(registry)

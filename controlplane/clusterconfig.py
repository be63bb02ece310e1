"""The cluster configuration the kinds read: the effective KubeVirt CR, as HCO last wrote it
from the HyperConverged (`projections.hco.effective_kubevirt`), and the settings the kinds
take from it, KubeVirt's defaults where it sets none. It sits below every kind that reads
it, and reads no kind's handlers.

| `ClusterConfig.`  | from the KubeVirt CR's `spec.`                 | read by                   |
|-------------------|------------------------------------------------|---------------------------|
| `feature_gates`   | `configuration.developerConfiguration`'s       | admission of VMs, VMIs and|
|                   | `featureGates`, `disabledFeatureGates`         | replica sets (`controlplane|
|                   |                                                | .feature_gates`)          |
| `migrations`      | `configuration.migrations`                     | migration commands and    |
|                   | (HCO's `liveMigrationConfig`)                  | controller                |
| `workload_updates`| `workloadUpdateStrategy`                       | workload updates' commands|
|                   |                                                | and controller            |
| `cpu_model`       | `configuration.cpuModel` (`defaultCPUModel`)   | VMI creation              |
| `pod_binding`     | `configuration.network.defaultNetworkInterface`| VMI creation              |

A decision reads it with `ClusterConfig.of_decision`: the KubeVirt CR loaded on the
decision's fresh state, so its append is guarded on the CR not changing meanwhile; a
decision that needs no setting must not read it (it then carries no such guard). A
controller reads it from its read model with `ClusterConfig.of_state`. Both take the CR's
`spec` and `spec.configuration` through the same functions of `projections.hco`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from controlplane.hco.duration import parse_go_duration
from controlplane.hco.operands.kubevirt import KUBEVIRT
from events.api import hco_defaults as d
from events.api.hco import HyperConverged
from events.api.resources import quantity
from events.api.vmi_defaults import DEFAULT_POD_BINDING
from events.language.kinds.hco import operand_id
from projections.hco import effective_kubevirt, kubevirt_configuration, kubevirt_cr, kubevirt_spec
from projections.kinds.hco import OperandView

if TYPE_CHECKING:
    from controlplane.decision import Decision
    from projections.cluster import ClusterState

KUBEVIRT_CR_ID: Final = operand_id(KUBEVIRT.kind, KUBEVIRT.name(HyperConverged()))
"""The KubeVirt CR's aggregate (HCO names it after the one HyperConverged)."""

GPUS_WITH_DRA: Final = "GPUsWithDRA"
HOST_DEVICES_WITH_DRA: Final = "HostDevicesWithDRA"
BETA_GATES: Final = frozenset({GPUS_WITH_DRA, HOST_DEVICES_WITH_DRA})
"""The gates virtbus checks that KubeVirt has in Beta: on unless `disabledFeatureGates`
names them."""
GIGA: Final = 10**9


@dataclass(frozen=True, slots=True)
class MigrationConfig:
    parallel_per_cluster: int = d.PARALLEL_MIGRATIONS_PER_CLUSTER
    parallel_outbound_per_node: int = d.PARALLEL_OUTBOUND_MIGRATIONS_PER_NODE
    bandwidth_bytes_per_second: int = 0
    """`bandwidthPerMigration`; 0 (unset, or "0Mi"): unlimited, as KubeVirt has it."""
    completion_timeout_per_gib: int = d.COMPLETION_TIMEOUT_PER_GIB
    progress_timeout: int = d.PROGRESS_TIMEOUT
    allow_post_copy: bool = d.ALLOW_POST_COPY
    allow_auto_converge: bool = d.ALLOW_AUTO_CONVERGE

    def completion_timeout_seconds(self, data_bytes: int) -> int:
        """completionTimeoutPerGiB times the data to copy (guest memory, and disks when they
        are copied) in units of 10^9 bytes rounded up, as KubeVirt's
        `getVMIMigrationDataSize` scales it (`ScaledValue(resource.Giga)`)."""
        return self.completion_timeout_per_gib * -(-data_bytes // GIGA)


@dataclass(frozen=True, slots=True)
class WorkloadUpdateConfig:
    methods: tuple[str, ...] = d.WORKLOAD_UPDATE_METHODS
    batch_size: int = d.BATCH_EVICTION_SIZE
    interval: timedelta = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The effective KubeVirt CR (None before HCO wrote one) and what the kinds read of it."""

    kubevirt: dict[str, Any] | None = None

    @classmethod
    def of_decision(cls, decision: Decision) -> ClusterConfig:
        """As the decision's fresh state has it; the decision is then guarded on it."""
        return cls(kubevirt_cr(decision.load(KUBEVIRT_CR_ID, OperandView).state))

    @classmethod
    def of_state(cls, state: ClusterState) -> ClusterConfig:
        """As the read model has it."""
        return cls(effective_kubevirt(state))

    @property
    def configuration(self) -> dict[str, Any]:
        """The CR's `spec.configuration`: what KubeVirt reads its cluster settings from."""
        return kubevirt_configuration(self.kubevirt)

    @property
    def feature_gates(self) -> frozenset[str]:
        """The gates on, as KubeVirt's `featuregate.IsEnabled` reads them: those
        `featureGates` lists, and each Beta gate that `disabledFeatureGates` does not name."""
        developer = self.configuration.get("developerConfiguration") or {}
        disabled = frozenset(developer.get("disabledFeatureGates") or [])
        return frozenset(developer.get("featureGates") or []) | (BETA_GATES - disabled)

    @property
    def migrations(self) -> MigrationConfig:
        return migration_config(self.configuration)

    @property
    def workload_updates(self) -> WorkloadUpdateConfig:
        return workload_update_config(kubevirt_spec(self.kubevirt))

    @property
    def cpu_model(self) -> str:
        """The CPU model a VMI created without one gets (KubeVirt's VMI defaulting); ""."""
        model = self.configuration.get("cpuModel", "")
        return model if isinstance(model, str) else ""

    @property
    def pod_binding(self) -> str:
        """The binding a VMI's default interface gets: `network.defaultNetworkInterface`
        (HCO writes masquerade), else KubeVirt's default."""
        network = self.configuration.get("network") or {}
        if not isinstance(network, dict):
            return DEFAULT_POD_BINDING
        return str(network.get("defaultNetworkInterface") or DEFAULT_POD_BINDING)


def migration_config(configuration: dict[str, Any]) -> MigrationConfig:
    """From `spec.configuration` of the KubeVirt CR; what does not parse keeps the default
    (HCO validated it on the way in; the log is not trusted to say so)."""
    raw = configuration.get("migrations") or {}
    if not isinstance(raw, dict):
        return MigrationConfig()
    base = MigrationConfig()

    def whole(key: str, default: int) -> int:
        value = raw.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
            else default

    def flag(key: str, default: bool) -> bool:
        value = raw.get(key)
        return value if isinstance(value, bool) else default

    bandwidth = 0
    if isinstance(raw.get("bandwidthPerMigration"), str | int):
        try:
            bandwidth = int(quantity(raw["bandwidthPerMigration"]))
        except (ValueError, ArithmeticError):
            bandwidth = 0
    return MigrationConfig(
        parallel_per_cluster=whole("parallelMigrationsPerCluster", base.parallel_per_cluster),
        parallel_outbound_per_node=whole("parallelOutboundMigrationsPerNode",
                                         base.parallel_outbound_per_node),
        bandwidth_bytes_per_second=max(0, bandwidth),
        completion_timeout_per_gib=whole("completionTimeoutPerGiB",
                                         base.completion_timeout_per_gib),
        progress_timeout=whole("progressTimeout", base.progress_timeout),
        allow_post_copy=flag("allowPostCopy", base.allow_post_copy),
        allow_auto_converge=flag("allowAutoConverge", base.allow_auto_converge),
    )


def workload_update_config(spec: dict[str, Any]) -> WorkloadUpdateConfig:
    """From the KubeVirt CR's `spec.workloadUpdateStrategy`; what does not parse keeps the
    default. No method listed means no automated updating, as the seed says of an explicitly
    empty list (HCO writes an empty list by leaving the field out, as Go's omitempty
    does); only with no strategy at all (no KubeVirt CR yet) do HCO's defaults apply."""
    raw = spec.get("workloadUpdateStrategy")
    if not isinstance(raw, dict):
        return WorkloadUpdateConfig()
    base = WorkloadUpdateConfig()
    methods = raw.get("workloadUpdateMethods", [])
    size = raw.get("batchEvictionSize", base.batch_size)
    interval = base.interval
    if isinstance(raw.get("batchEvictionInterval"), str):
        try:
            interval = parse_go_duration(raw["batchEvictionInterval"])
        except ValueError:
            interval = base.interval
    return WorkloadUpdateConfig(
        methods=tuple(m for m in methods if isinstance(m, str)) if isinstance(methods, list)
        else base.methods,
        batch_size=size if isinstance(size, int) and size > 0 else base.batch_size,
        interval=interval)

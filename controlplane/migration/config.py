"""The migration limits and timeouts in force: the effective KubeVirt CR's
`configuration.migrations` (HCO's `liveMigrationConfig`), KubeVirt's defaults where unset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from events.api import hco_defaults as d
from events.api.resources import quantity

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

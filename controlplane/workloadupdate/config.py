"""The workload update strategy in force: the effective KubeVirt CR's
`workloadUpdateStrategy` (HCO's), KubeVirt's defaults where unset."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from controlplane.hco.duration import parse_go_duration
from events.api import hco_defaults as d


@dataclass(frozen=True, slots=True)
class WorkloadUpdateConfig:
    methods: tuple[str, ...] = d.WORKLOAD_UPDATE_METHODS
    batch_size: int = d.BATCH_EVICTION_SIZE
    interval: timedelta = timedelta(minutes=1)


def workload_update_config(kubevirt_spec: dict[str, Any]) -> WorkloadUpdateConfig:
    """From the KubeVirt CR's `spec.workloadUpdateStrategy`; what does not parse keeps the
    default. No method listed means no automated updating, as the seed says of an explicitly
    empty list (HCO writes an empty list by leaving the field out, as Go's omitempty
    does); only with no strategy at all (no KubeVirt CR yet) do HCO's defaults apply."""
    raw = kubevirt_spec.get("workloadUpdateStrategy")
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

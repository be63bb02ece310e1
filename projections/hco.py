"""The HyperConverged and its operand CRs as read models, and HCO's metrics and alerts.

The write side decides on these views and the read side renders them. Metrics are folded
from what the views keep (every revert, every change of the jsonpatch annotations, with
the event's own time), so a replay of the log gives the same counters and alerts.

`effective_kubevirt(state)` is the KubeVirt CR as HCO last wrote it: the cluster
configuration every other controller reads. Its `spec` and `spec.configuration` are taken
by `kubevirt_spec` and `kubevirt_configuration`, on the read model and in the write side's
decisions alike (`controlplane.clusterconfig`).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec

from events.api import hco_defaults as d
from events.api.base import ObjectMeta
from events.api.resources import (
    CPU_ALLOCATION_RATIO,
    MEMORY_OVERCOMMIT_PERCENT,
    ClusterTuning,
)
from events.language.kinds.hco import (
    hco_id,
)
from projections import migration_metrics
from projections.hco_metrics import Alert, HcoMetrics
from projections.kinds.hco import HyperConvergedView, OperandView
from projections.kinds.migration import MigrationView
from projections.views import View, iso, object_meta

if TYPE_CHECKING:
    from projections.cluster import ClusterState


# -- accessors -------------------------------------------------------------------------------


def hyperconverged(state: ClusterState) -> HyperConvergedView | None:
    view = state.views.get(hco_id())
    return view if isinstance(view, HyperConvergedView) and view.exists else None


def operands(state: ClusterState, *, deleted: bool = False) -> Iterator[OperandView]:
    for view in state.views.values():
        if isinstance(view, OperandView) and (view.exists or deleted):
            yield view


def operand(state: ClusterState, kind: str) -> OperandView | None:
    return next((v for v in operands(state) if v.kind == kind), None)


# -- the effective KubeVirt configuration: read side and write side alike -----------------


def effective_kubevirt(state: ClusterState) -> dict[str, Any] | None:
    """The KubeVirt CR as HCO last wrote it (or as reverted); None before HCO wrote one."""
    return kubevirt_cr(operand(state, "KubeVirt"))


def kubevirt_cr(view: OperandView | None) -> dict[str, Any] | None:
    """The KubeVirt CR its operand view holds (as HCO last wrote it, as reverted, or as
    written out of band since); None before HCO wrote one, and once deleted. The read
    model's view (`effective_kubevirt`) and a decision's (`controlplane.clusterconfig`)."""
    return view.object if view is not None and view.exists else None


def kubevirt_spec(kubevirt: dict[str, Any] | None) -> dict[str, Any]:
    """The KubeVirt CR's `spec`; {} without one (or one that is no object)."""
    spec = (kubevirt or {}).get("spec")
    return spec if isinstance(spec, dict) else {}


def kubevirt_configuration(kubevirt: dict[str, Any] | None) -> dict[str, Any]:
    """The KubeVirt CR's `spec.configuration`, what KubeVirt reads its cluster settings
    from; {} without one (KubeVirt's defaults hold)."""
    configuration = kubevirt_spec(kubevirt).get("configuration")
    return configuration if isinstance(configuration, dict) else {}


def cluster_tuning(state: ClusterState) -> ClusterTuning:
    """The scheduler's knobs from the effective KubeVirt (KubeVirt's defaults before HCO
    has written one)."""
    config = kubevirt_configuration(effective_kubevirt(state)).get(
        "developerConfiguration", {})
    return ClusterTuning(
        cpu_allocation_ratio=int(config.get("cpuAllocationRatio", CPU_ALLOCATION_RATIO)),
        memory_overcommit_percent=int(config.get("memoryOvercommit",
                                                 MEMORY_OVERCOMMIT_PERCENT)))


def metrics(state: ClusterState) -> HcoMetrics:
    """HCO's metrics, folded from the views in event-time order per series, and the
    messages of the log the fold skipped."""
    folded = HcoMetrics()
    for reason, count in sorted(state.skipped.items()):
        folded.on_skipped(reason, count)
    for view in operands(state, deleted=True):
        for component, at in view.reverts:
            folded.on_revert(component, at)
    hco = state.views.get(hco_id())
    if isinstance(hco, HyperConvergedView):
        for counts, at in hco.unsafe_history:
            folded.on_annotations(counts, at)
    return folded


# -- rendering -------------------------------------------------------------------------------


def with_defaults(value: Any) -> Any:
    """An API struct as JSON with every defaulted field written out (unset pointers left out),
    as the API server shows an object after defaulting."""
    if isinstance(value, ObjectMeta):
        return msgspec.to_builtins(value)
    if isinstance(value, msgspec.Struct):
        out = {}
        for f in msgspec.structs.fields(value):
            item = getattr(value, f.name)
            if item is not None:
                out[f.encode_name] = with_defaults(item)
        return out
    if isinstance(value, dict):
        return {key: with_defaults(item) for key, item in value.items()}
    if isinstance(value, list):
        return [with_defaults(item) for item in value]
    return value


def render_hco(hco: HyperConvergedView, related: list[OperandView]) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [msgspec.to_builtins(c) for c in hco.conditions],
        "observedGeneration": hco.observed_generation,
        "systemHealthStatus": hco.system_health_status,
        "relatedObjects": [_reference(v) for v in sorted(related, key=lambda v: v.id)],
    }
    if hco.patch_failures:
        status["jsonPatchFailures"] = [msgspec.to_builtins(f) for f in hco.patch_failures]
    return {
        "apiVersion": d.API_VERSION,
        "kind": d.KIND,
        "metadata": object_meta(hco, hco.metadata, hco.uid, hco.generation),
        "spec": with_defaults(hco.spec),
        "status": status,
    }


def _reference(view: OperandView) -> dict[str, Any]:
    meta = view.object.get("metadata", {})
    ref = {"apiVersion": view.object.get("apiVersion", ""), "kind": view.kind,
           "name": meta.get("name", ""), "resourceVersion": str(view.last_sequence)}
    if meta.get("namespace"):
        ref["namespace"] = meta["namespace"]
    return ref


def render_operand(view: OperandView) -> dict[str, Any]:
    obj = dict(view.object)
    obj["metadata"] = {**obj.get("metadata", {}), "resourceVersion": str(view.last_sequence),
                       "creationTimestamp": iso(view.created_at)}
    return obj


def render_view(state: ClusterState, view: View) -> dict[str, Any] | None:
    """A HyperConverged or operand view in its API shape; None for other views."""
    match view:
        case HyperConvergedView():
            return render_hco(view, list(operands(state)))
        case OperandView():
            return render_operand(view)
    return None


def render_kind(state: ClusterState, kind: str) -> list[dict[str, Any]]:
    """Every object of an HCO kind (one per cluster)."""
    if kind == d.KIND:
        hco = hyperconverged(state)
        return [render_hco(hco, list(operands(state)))] if hco is not None else []
    view = operand(state, kind)
    return [render_operand(view)] if view is not None else []


def render_alert(alert: Alert) -> dict[str, Any]:
    return {"name": alert.name, "severity": alert.severity, "labels": alert.labels,
            "activeSince": iso(alert.active_since)}


METRICS_QUERY = "Metrics"
"""Query kind answered with the Prometheus exposition (one item, `text`)."""
ALERTS_QUERY = "Alerts"
"""Query kind answered with the alerts firing at query time."""


def answer(state: ClusterState, kind: str, name: str, now: datetime) -> list[dict[str, Any]]:
    """The read service's answer for an HCO kind, `Metrics` or `Alerts`. Counters come from
    the log alone; only whether an alert still fires depends on `now`."""
    if kind == METRICS_QUERY:
        migrations = [v for v in state.views.values() if isinstance(v, MigrationView)]
        text = metrics(state).exposition() + migration_metrics.exposition(migrations)
        return [{"text": text.decode()}]
    if kind == ALERTS_QUERY:
        return [render_alert(alert) for alert in metrics(state).alerts(now)]
    return [o for o in render_kind(state, kind) if not name or o["metadata"]["name"] == name]

"""The one interface every operand implements: derive its CR from the HyperConverged.

An operand is data plus one pure function (`spec`), so adding one is a new module holding an
`Operand(...)` and a line in `operands/__init__.py`. Derivation is deterministic: the same
HyperConverged and `ClusterInfo` always give the same JSON, which is what lets `drift`
tell an out-of-band edit from no change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from events.api import hco_defaults as d
from events.api.hco import CertConfig, DataImportCronTemplate, HyperConverged, NodePlacement

JSON = dict[str, Any]


@dataclass(frozen=True)
class ClusterInfo:
    """What derivation needs to know about the cluster that the HyperConverged does not say.

    `highly_available`: more than one worker node (eviction strategy, infra replicas).
    `common_boot_images`: the golden images HCO ships; SSP gets them unless disabled.
    """

    highly_available: bool = True
    base_domain: str = ""
    common_boot_images: tuple[DataImportCronTemplate, ...] = ()


@dataclass(frozen=True)
class Operand:
    """One operand CR kind that HCO owns and reverts to the derived state."""

    kind: str
    api_version: str
    component: str
    jsonpatch_annotation: str
    name: Callable[[HyperConverged], str]
    namespaced: bool
    spec: Callable[[HyperConverged, ClusterInfo], JSON]
    annotations: Callable[[HyperConverged], dict[str, str]] = lambda _hco: {}

    def derive(self, hco: HyperConverged, cluster: ClusterInfo) -> JSON:
        """The operand CR as HCO would write it, before any jsonpatch annotation."""
        metadata: JSON = {"name": self.name(hco), "labels": self.labels(hco)}
        if self.namespaced:
            metadata["namespace"] = hco.metadata.namespace
        if annotations := self.annotations(hco):
            metadata["annotations"] = annotations
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "metadata": metadata,
            "spec": self.spec(hco, cluster),
        }

    def labels(self, hco: HyperConverged) -> dict[str, str]:
        return {
            "app": hco.metadata.name,
            "app.kubernetes.io/component": self.component,
            "app.kubernetes.io/managed-by": "hco-operator",
            "app.kubernetes.io/part-of": "hyperconverged-cluster",
        }


def to_json(value: object) -> Any:
    """An API struct as the camelCase JSON the operand CRs take (defaults left out)."""
    return msgspec.to_builtins(value)


def placement(node_placement: NodePlacement | None) -> JSON | None:
    """HCO's nodePlacement as the operand's placement object; `None` when nothing is set."""
    if node_placement is None:
        return None
    encoded: JSON = to_json(node_placement)
    return encoded or None


def eviction_strategy(hco: HyperConverged, cluster: ClusterInfo) -> str:
    """The seed's default: LiveMigrate with several workers, None on a single worker."""
    if hco.spec.eviction_strategy is not None:
        return hco.spec.eviction_strategy
    if cluster.highly_available:
        return d.EVICTION_STRATEGY_MULTI_WORKER
    return d.EVICTION_STRATEGY_SINGLE_WORKER


def compact(values: JSON) -> JSON:
    """Drop unset (`None`) entries, as Go's omitempty would."""
    return {key: value for key, value in values.items() if value is not None}


def cert_config(certs: CertConfig) -> JSON:
    """The `{ca, server} x {duration, renewBefore}` shape KubeVirt and CDI share, always full."""
    return {
        "ca": {"duration": certs.ca.duration, "renewBefore": certs.ca.renew_before},
        "server": {"duration": certs.server.duration, "renewBefore": certs.server.renew_before},
    }

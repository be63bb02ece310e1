"""What a node agent reports about its host, the names the scheduler matches on, and the
bodies of an operator's `label` and `taint` commands (the client sends what the handler reads).

The agent observes; the control plane turns a `NodeInfo` into Node status and labels.
Label prefixes live here because the scheduler builds node selectors from the same
strings that the agent's discovery writes (KubeVirt's `cpu-model.node.kubevirt.io/<model>`
and the older `feature.node.kubernetes.io/cpu-model-<model>` that VMIs still select on).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from events.api.base import ApiStruct
from events.api.kinds import AGE, NAME, Column, Kind, at_path, condition_status, declare
from events.api.resources import HUGEPAGES_PREFIX
from events.api.scheduling import Taint, TaintEffect

RESOURCE_CPU = "cpu"
RESOURCE_MEMORY = "memory"
RESOURCE_PODS = "pods"

CPU_MODEL_LABEL = "cpu-model.node.kubevirt.io/"
CPU_FEATURE_LABEL = "cpu-feature.node.kubevirt.io/"
HOST_MODEL_CPU_LABEL = "host-model-cpu.node.kubevirt.io/"
CPU_VENDOR_LABEL = "cpu-vendor.node.kubevirt.io/"
NFD_CPU_MODEL_LABEL = "feature.node.kubernetes.io/cpu-model-"
NFD_CPU_FEATURE_LABEL = "feature.node.kubernetes.io/cpu-feature-"

_BINARY_SUFFIXES = (("Ti", 1024**3), ("Gi", 1024**2), ("Mi", 1024), ("Ki", 1))


def kib_quantity(kib: int) -> str:
    """A KiB amount as a Kubernetes quantity in its largest exact binary unit (`2Mi`, `0`)."""
    if kib == 0:
        return "0"
    suffix, unit = next((s, u) for s, u in _BINARY_SUFFIXES if kib % u == 0)
    return f"{kib // unit}{suffix}"


def hugepages_resource(page_kib: int) -> str:
    """Kubernetes' resource name for one page size: 2048 KiB -> `hugepages-2Mi`."""
    return HUGEPAGES_PREFIX + kib_quantity(page_kib)


class NodeInfo(ApiStruct):
    """A host as its agent sees it; equal infos mean nothing to re-report."""

    node_name: str
    hostname: str
    architecture: str
    hypervisor_uri: str
    domain_type: str
    libvirt_version: str
    capacity: dict[str, str]
    allocatable: dict[str, str]
    labels: dict[str, str] = {}
    host_cpu_model: str = ""
    cpu_vendor: str = ""
    cpu_models: list[str] = []
    cpu_features: list[str] = []
    agent_version: str = ""
    """The node agent's version: a VMI launched by an older one is outdated after an
    upgrade (`kubevirt.io/outdatedLauncherImage`)."""


class LabelBody(msgspec.Struct, frozen=True, kw_only=True):
    """`label node N k=v k2-`: labels to set and keys to remove; a label set already to
    another value is replaced only with `overwrite` (kubectl's `--overwrite`)."""

    labels: dict[str, str] = {}
    remove: list[str] = []
    overwrite: bool = False


class TaintKey(msgspec.Struct, frozen=True, kw_only=True):
    """A taint to remove: `key:Effect-`, or every effect of `key` (`key-`)."""

    key: str
    effect: TaintEffect | None = None


class TaintBody(msgspec.Struct, frozen=True, kw_only=True):
    """`taint node N k=v:Effect k2-`: taints to add and to remove; a taint of the same key and
    effect is replaced only with `overwrite`."""

    add: list[Taint] = []
    remove: list[TaintKey] = []
    overwrite: bool = False


def _node_status(obj: dict[str, Any]) -> str:
    """kubectl's STATUS of a node: Ready or NotReady, and SchedulingDisabled when cordoned."""
    ready = "Ready" if condition_status(obj, "Ready") == "True" else "NotReady"
    return ready + (",SchedulingDisabled" if at_path(obj, ".spec.unschedulable") else "")


NODE: Final = declare(Kind(
    kind="Node", group="", versions=("v1",), plural="nodes", token="node", short_names=("no",),
    namespaced=False, subresources=("status",),
    columns=(NAME, Column("STATUS", ".status.conditions", value=_node_status), AGE)))
"""Written by virtbus only: an agent's reports, an operator's label, taint, cordon, drain."""

"""The host CPU as libvirt describes it, and the node labels KubeVirt derives from it.

Where libvirt can say which models it can run (domain capabilities: the host-model CPU
and custom models marked usable='yes'), that is the answer, as in virt-handler's node
labeller. Drivers without domain capabilities (the test driver) fall back to the host
CPU of `getCapabilities()`: its model, or the model the agent was told to pretend to be,
and the models of libvirt's CPU map whose features that CPU has.
Feature lists always come from libvirt's CPU map (`baselineCPU` with expanded features),
never from a table of our own.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, NamedTuple
from xml.sax.saxutils import escape

import libvirt

from events.api.errors import InvalidSpec
from events.api.node import (
    CPU_FEATURE_LABEL,
    CPU_MODEL_LABEL,
    CPU_VENDOR_LABEL,
    HOST_MODEL_CPU_LABEL,
    NFD_CPU_FEATURE_LABEL,
    NFD_CPU_MODEL_LABEL,
)
from nodeagent.virterror import is_unsupported

if TYPE_CHECKING:
    from collections.abc import Iterable


class HostCpu(NamedTuple):
    """What the host CPU is, supports, and can present to guests."""

    model: str
    vendor: str
    features: frozenset[str]
    usable_models: tuple[str, ...]


_EXPANDED: dict[tuple[str, str, str, str], frozenset[str]] = {}
"""Each model's expanded features, by connection URI, architecture, domain type and model:
libvirt's CPU map does not change under a running process, and each rediscovery (every
minute per node, a hundred nodes in a fleet) asked it again for every model (half the
fleet's CPU at 10,000 VMs)."""


class CpuMap:
    """libvirt's CPU map for one architecture, asked once per model in this process."""

    def __init__(self, conn: libvirt.virConnect, arch: str, domain_type: str) -> None:
        self._conn = conn
        self.arch = arch
        self.domain_type = domain_type
        self._key = (conn.getURI(), arch, domain_type)

    def models(self) -> list[str]:
        return list(self._conn.getCPUModelNames(self.arch))

    def features(self, model: str, extra: Iterable[str] = ()) -> frozenset[str]:
        """Every feature `model` (plus `extra`) has, expanded by libvirt."""
        extra = tuple(extra)
        key = (*self._key, model)
        if not extra and key in _EXPANDED:
            return _EXPANDED[key]
        flags = "".join(f"<feature name='{escape(f)}'/>" for f in extra)
        cpu = f"<cpu><arch>{escape(self.arch)}</arch><model>{escape(model)}</model>{flags}</cpu>"
        flag = libvirt.VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES
        try:
            expanded = self._conn.baselineHypervisorCPU(
                None, self.arch, None, self.domain_type, [cpu], flag
            )
        except libvirt.libvirtError as err:
            if not is_unsupported(err):
                raise
            expanded = self._conn.baselineCPU([cpu], flag)
        result = frozenset(
            str(f.get("name"))
            for f in ET.fromstring(expanded).iter("feature")
            if f.get("policy", "require") == "require"
        )
        if not extra:
            _EXPANDED[key] = result
        return result

    def min_model_features(self, model: str) -> frozenset[str]:
        """Features of minCPUModel, refusing a name libvirt does not know."""
        if model not in self.models():
            raise InvalidSpec(
                "spec.obsoleteCPUs.minCPUModel",
                f"must be a CPU model libvirt knows for {self.arch}; {model!r} is not",
            )
        return self.features(model)


def host_cpu(conn: libvirt.virConnect, cpu_map: CpuMap, declared_model: str) -> HostCpu:
    """Domain capabilities where the driver has them, else the capabilities' host CPU: for
    the domain type the node's guests get (`cpu_map.domain_type`), not libvirt's default
    (kvm wherever /dev/kvm exists, whose host-model TCG guests do not get)."""
    try:
        domcaps = conn.getDomainCapabilities(None, cpu_map.arch, None, cpu_map.domain_type, 0)
    except libvirt.libvirtError as err:
        if not is_unsupported(err):
            raise
        return _from_capabilities(ET.fromstring(conn.getCapabilities()), cpu_map, declared_model)
    return from_domain_capabilities(domcaps, cpu_map)


def from_domain_capabilities(xml: str, cpu_map: CpuMap) -> HostCpu:
    """Host-model CPU and usable custom models, as virt-handler's node labeller reads them."""
    root = ET.fromstring(xml)
    usable = tuple(
        str(m.text)
        for m in root.iterfind("cpu/mode[@name='custom']/model")
        if m.get("usable") == "yes"
    )
    mode = root.find("cpu/mode[@name='host-model']")
    if mode is None or mode.get("supported") != "yes":
        return HostCpu(model="", vendor="", features=frozenset(), usable_models=usable)
    model = mode.findtext("model", "")
    policies = {str(f.get("name")): f.get("policy") for f in mode.iterfind("feature")}
    required = [name for name, policy in policies.items() if policy == "require"]
    disabled = {name for name, policy in policies.items() if policy == "disable"}
    return HostCpu(
        model=model,
        vendor=mode.findtext("vendor", ""),
        features=cpu_map.features(model, required) - disabled,
        usable_models=usable,
    )


def _from_capabilities(root: ET.Element, cpu_map: CpuMap, declared_model: str) -> HostCpu:
    cpu = root.find("host/cpu")
    if cpu is None:
        return HostCpu(model="", vendor="", features=frozenset(), usable_models=())
    flags = {str(f.get("name")) for f in cpu.iterfind("feature")}
    model = cpu.findtext("model", "") or declared_model
    features = frozenset(flags | (cpu_map.features(model) if model else set()))
    usable = tuple(m for m in cpu_map.models() if cpu_map.features(m) <= features)
    return HostCpu(
        model=model, vendor=cpu.findtext("vendor", ""), features=features, usable_models=usable
    )


def labelled_models(host: HostCpu, obsolete: frozenset[str]) -> list[str]:
    """Usable models that are not obsolete: those a VMI may ask for by name."""
    return sorted(set(host.usable_models) - obsolete)


def labelled_features(host: HostCpu, min_model_features: frozenset[str]) -> list[str]:
    """Host features beyond minCPUModel's: every node has those, so they select nothing."""
    return sorted(host.features - min_model_features)


def cpu_labels(
    host: HostCpu, models: Iterable[str], features: Iterable[str], obsolete: frozenset[str]
) -> dict[str, str]:
    """Node labels in both the KubeVirt and node-feature-discovery forms VMIs select on."""
    labels: dict[str, str] = {}
    for model in models:
        labels[CPU_MODEL_LABEL + model] = "true"
        labels[NFD_CPU_MODEL_LABEL + model] = "true"
    for feature in features:
        labels[CPU_FEATURE_LABEL + feature] = "true"
        labels[NFD_CPU_FEATURE_LABEL + feature] = "true"
    if host.model and host.model not in obsolete:
        labels[HOST_MODEL_CPU_LABEL + host.model] = "true"
    if host.vendor:
        labels[CPU_VENDOR_LABEL + host.vendor] = "true"
    return dict(sorted(labels.items()))

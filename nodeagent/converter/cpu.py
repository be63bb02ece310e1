"""`<vcpu>`, `<vcpus>` and `<cpu>`: vCPU count, hot-plug slots, topology, model and features.

CPU model decision (seed "Enabling default cluster cpu model"; HCO `defaultCPUModel`):

| spec.domain.cpu.model | cluster defaultCPUModel | `<cpu>`                                 |
|-----------------------|-------------------------|-----------------------------------------|
| host-passthrough      | any                     | mode='host-passthrough'                 |
| host-model            | any                     | mode='host-model'                       |
| a named model X       | any                     | mode='custom', `<model>X</model>`       |
| unset                 | a named model D         | mode='custom', `<model>D</model>`       |
| unset                 | host-model/passthrough  | that mode                               |
| unset                 | unset                   | mode='host-model'                       |

Features keep their policy; an omitted policy is `require`. `evmcs` adds `vmx`
(`events.api.vmi_defaults.cpu_features`). A named model gets `mpx` disabled unless the spec
lists mpx: libvirt's x86 model definitions still carry MPX, which current CPUs and QEMU
dropped, and would refuse the model (KubeVirt's converter does the same on amd64).

`cpu.maxSockets` (KubeVirt's CPU hot-plug): the topology and `<vcpu>` count are the maximum;
`<vcpus>` enables the requested vCPUs, the first socket's not hot-pluggable, the rest so.

Hugepages backed by memfd (`memory.memfd_backed`) need a NUMA topology: one cell with every
vCPU and all guest memory, as KubeVirt's synthetic NUMA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from events.api.resources import cpu_topology, guest_memory_bytes
from events.api.vmi_defaults import cpu_features
from nodeagent.converter import defaults
from nodeagent.converter.memory import memfd_backed
from nodeagent.converter.xmltree import sub, yes_no

if TYPE_CHECKING:
    from events.api.resources import CPUTopology
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element

MPX_FEATURE = "mpx"


def cpu_model(spec_model: str, cluster_default: str) -> str:
    """The model row of the table above: the VMI's, else the cluster's, else host-model."""
    return spec_model or cluster_default or defaults.HOST_MODEL


def configure_cpu(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    vmi_cpu = spec.domain.cpu
    requested = cpu_topology(spec.domain)
    max_sockets = vmi_cpu.max_sockets if vmi_cpu is not None else 0
    topology = requested._replace(sockets=max_sockets) if max_sockets else requested
    sub(domain, "vcpu", topology.vcpus, placement="static")
    if max_sockets:
        _configure_hotplug_vcpus(requested, topology.vcpus, domain)

    model = cpu_model(vmi_cpu.model if vmi_cpu is not None else "", ctx.default_cpu_model)
    if model in defaults.HOST_CPU_MODES:
        cpu = sub(domain, "cpu", mode=model)
    else:
        cpu = sub(domain, "cpu", mode="custom")
        sub(cpu, "model", model)
    sub(
        cpu,
        "topology",
        sockets=topology.sockets,
        cores=topology.cores,
        threads=topology.threads,
    )
    features = spec.domain.features
    wanted = cpu_features(vmi_cpu, features.hyperv if features is not None else None)
    for feature in wanted:
        sub(
            cpu, "feature", name=feature.name, policy=feature.policy or defaults.CPU_FEATURE_POLICY
        )
    if model not in defaults.HOST_CPU_MODES and all(f.name != MPX_FEATURE for f in wanted):
        sub(cpu, "feature", name=MPX_FEATURE, policy="disable")
    if memfd_backed(spec, ctx):
        memory_kib = guest_memory_bytes(spec.domain) // 1024
        cell = f"0-{topology.vcpus - 1}"
        sub(sub(cpu, "numa"), "cell", id=0, cpus=cell, memory=memory_kib, unit="KiB")


def _configure_hotplug_vcpus(requested: CPUTopology, total: int, domain: Element) -> None:
    """One `<vcpu>` per possible vCPU: the requested ones enabled, all but the first
    socket's hot-pluggable (KubeVirt's configureCPUTopology)."""
    vcpus = sub(domain, "vcpus")
    first_socket = requested.cores * requested.threads
    for vcpu_id in range(total):
        sub(
            vcpus,
            "vcpu",
            id=vcpu_id,
            enabled=yes_no(vcpu_id < requested.vcpus, default=True),
            hotpluggable=yes_no(vcpu_id >= first_socket, default=False),
        )

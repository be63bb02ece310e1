"""`<vcpu>` and `<cpu>`: vCPU count, topology, model and features.

CPU model decision (seed "Enabling default cluster cpu model"; HCO `defaultCPUModel`):

| spec.domain.cpu.model | cluster defaultCPUModel | `<cpu>`                                 |
|-----------------------|-------------------------|-----------------------------------------|
| host-passthrough      | any                     | mode='host-passthrough'                 |
| host-model            | any                     | mode='host-model'                       |
| a named model X       | any                     | mode='custom', `<model>X</model>`       |
| unset                 | a named model D         | mode='custom', `<model>D</model>`       |
| unset                 | host-model/passthrough  | that mode                               |
| unset                 | unset                   | mode='host-model'                       |

Features keep their policy; an omitted policy is `require`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from events.api.resources import cpu_topology
from nodeagent.converter import defaults
from nodeagent.converter.xmltree import sub

if TYPE_CHECKING:
    from events.api.validation import VMISpecLike
    from nodeagent.converter.context import ConverterContext
    from nodeagent.converter.xmltree import Element


def cpu_model(spec_model: str, cluster_default: str) -> str:
    """The model row of the table above: the VMI's, else the cluster's, else host-model."""
    return spec_model or cluster_default or defaults.HOST_MODEL


def configure_cpu(spec: VMISpecLike, ctx: ConverterContext, domain: Element) -> None:
    vmi_cpu = spec.domain.cpu
    topology = cpu_topology(spec.domain)
    sub(domain, "vcpu", topology.vcpus, placement="static")

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
    for feature in vmi_cpu.features if vmi_cpu is not None else ():
        sub(
            cpu, "feature", name=feature.name, policy=feature.policy or defaults.CPU_FEATURE_POLICY
        )

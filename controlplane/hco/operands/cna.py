"""The NetworkAddonsConfig CR (CNAO): network components, placement, self-signed certificates.

| HyperConverged                          | NetworkAddonsConfig spec                        |
|-----------------------------------------|-------------------------------------------------|
| (always)                                | multus, linuxBridge, kubeMacPool                |
| annotation deployOVS: "true"            | ovs                                             |
| featureGates.deployKubeSecondaryDNS     | kubeSecondaryDNS {domain, nameServerIP}         |
| kubeSecondaryDNSNameServerIP            | kubeSecondaryDNS.nameServerIP                   |
| infra / workloads nodePlacement         | placementConfiguration.infra / .workloads       |
| certConfig (Go duration strings)        | selfSignConfiguration                           |
| tlsSecurityProfile (or Intermediate)    | tlsSecurityProfile                              |
"""

from __future__ import annotations

from typing import Final

from controlplane.hco import tls
from controlplane.hco.duration import format_go_duration, parse_go_duration
from controlplane.hco.operands.base import JSON, ClusterInfo, Operand, compact, placement
from events.api import hco_defaults as d
from events.api.hco import CertConfig, HyperConverged

NAME: Final = "cluster"


def _self_sign(certs: CertConfig) -> JSON:
    def go(text: str) -> str:
        return format_go_duration(parse_go_duration(text))

    return {
        "caRotateInterval": go(certs.ca.duration),
        "caOverlapInterval": go(certs.ca.renew_before),
        "certRotateInterval": go(certs.server.duration),
        "certOverlapInterval": go(certs.server.renew_before),
    }


def _spec(hco: HyperConverged, cluster: ClusterInfo) -> JSON:
    spec = hco.spec
    infra = placement(spec.infra.node_placement)
    workloads = placement(spec.workloads.node_placement)
    secondary_dns = {
        "domain": cluster.base_domain,
        "nameServerIP": spec.kube_secondary_dns_name_server_ip or "",
    }
    deploy_ovs = hco.metadata.annotations.get(d.DEPLOY_OVS_ANNOTATION) == "true"
    return compact(
        {
            "multus": {},
            "linuxBridge": {},
            "kubeMacPool": {},
            "ovs": {} if deploy_ovs else None,
            "kubeSecondaryDNS": (
                secondary_dns if spec.feature_gates.deploy_kube_secondary_dns else None
            ),
            "placementConfiguration": (
                compact({"infra": infra, "workloads": workloads})
                if infra is not None or workloads is not None
                else None
            ),
            "selfSignConfiguration": _self_sign(spec.cert_config),
            "tlsSecurityProfile": tls.profile_json(spec),
        }
    )


CNA = Operand(
    kind="NetworkAddonsConfig",
    api_version=d.OPERAND_API_VERSIONS["NetworkAddonsConfig"],
    component="network",
    jsonpatch_annotation=d.CNAO_JSONPATCH_ANNOTATION,
    name=lambda _hco: NAME,
    namespaced=False,
    spec=_spec,
)

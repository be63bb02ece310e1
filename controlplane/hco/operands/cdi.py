"""The CDI CR: storage import settings, placement and certificate rotation.

| HyperConverged spec                     | CDI spec                             |
|-----------------------------------------|--------------------------------------|
| uninstallStrategy                       | uninstallStrategy                    |
| resourceRequirements.storageWorkloads   | config.podResourceRequirements       |
| scratchSpaceStorageClass                | config.scratchSpaceStorageClass      |
| filesystemOverhead                      | config.filesystemOverhead            |
| storageImport.insecureRegistries        | config.insecureRegistries            |
| logVerbosityConfig.cdi                  | config.logVerbosity                  |
| tlsSecurityProfile (or Intermediate)    | config.tlsSecurityProfile            |
| certConfig                              | certConfig                           |
| infra / workloads nodePlacement         | infra / workloads                    |
"""

from __future__ import annotations

from typing import Final

from controlplane.hco import tls
from controlplane.hco.operands.base import (
    JSON,
    ClusterInfo,
    Operand,
    cert_config,
    compact,
    placement,
    to_json,
)
from events.api import hco_defaults as d
from events.api.hco import HyperConverged

FEATURE_GATES: Final = ("HonorWaitForFirstConsumer",)
CONFIG_AUTHORITY_ANNOTATION: Final = "cdi.kubevirt.io/configAuthority"


def _spec(hco: HyperConverged, _cluster: ClusterInfo) -> JSON:
    spec = hco.spec
    storage = spec.resource_requirements.storage_workloads
    registries = spec.storage_import.insecure_registries if spec.storage_import else []
    log = spec.log_verbosity_config
    return compact(
        {
            "uninstallStrategy": spec.uninstall_strategy,
            "config": compact(
                {
                    "featureGates": list(FEATURE_GATES),
                    "tlsSecurityProfile": tls.profile_json(spec),
                    "podResourceRequirements": to_json(storage),
                    "scratchSpaceStorageClass": spec.scratch_space_storage_class,
                    "filesystemOverhead": to_json(spec.filesystem_overhead),
                    "insecureRegistries": list(registries) or None,
                    "logVerbosity": log.cdi if log else None,
                }
            ),
            "certConfig": cert_config(spec.cert_config),
            "infra": placement(spec.infra.node_placement),
            "workloads": placement(spec.workloads.node_placement),
        }
    )


CDI = Operand(
    kind="CDI",
    api_version=d.OPERAND_API_VERSIONS["CDI"],
    component="storage",
    jsonpatch_annotation=d.CDI_JSONPATCH_ANNOTATION,
    name=lambda hco: f"cdi-{hco.metadata.name}",
    namespaced=False,
    spec=_spec,
    annotations=lambda _hco: {CONFIG_AUTHORITY_ANNOTATION: ""},
)

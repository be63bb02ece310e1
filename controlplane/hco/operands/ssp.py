"""The SSP CR: common templates, template validator placement, golden images, console proxy.

Golden images follow the table in README.md, "SSP golden images".
"""

from __future__ import annotations

from controlplane.hco import tls
from controlplane.hco.operands.base import JSON, ClusterInfo, Operand, compact, placement, to_json
from events.api import hco_defaults as d
from events.api.hco import DataImportCronTemplate, HyperConverged


def _disabled(template: DataImportCronTemplate) -> bool:
    return template.metadata.annotations.get(d.DATA_IMPORT_CRON_ENABLE_ANNOTATION) == "false"


def _modified(common: DataImportCronTemplate, custom: DataImportCronTemplate) -> JSON:
    encoded: JSON = to_json(custom)
    common_spec = common.spec or {}
    if "schedule" not in (custom.spec or {}) and "schedule" in common_spec:
        encoded["spec"] = {**encoded.get("spec", {}), "schedule": common_spec["schedule"]}
    return encoded


def golden_images(hco: HyperConverged, cluster: ClusterInfo) -> list[JSON]:
    """The DataImportCronTemplates SSP receives (README.md, "SSP golden images")."""
    in_spec = {t.metadata.name: t for t in hco.spec.data_import_cron_templates}
    common = (
        cluster.common_boot_images
        if hco.spec.feature_gates.enable_common_boot_image_import
        else ()
    )
    common_names = {t.metadata.name for t in cluster.common_boot_images}
    images: list[JSON] = []
    for shipped in common:
        custom = in_spec.get(shipped.metadata.name)
        if custom is None:
            encoded: JSON = to_json(shipped)
            if namespace := hco.spec.common_boot_image_namespace:
                encoded["metadata"] = {**encoded["metadata"], "namespace": namespace}
            images.append(encoded)
        elif not _disabled(custom):
            images.append(_modified(shipped, custom))
    images.extend(
        to_json(t) for name, t in in_spec.items() if name not in common_names and not _disabled(t)
    )
    return images


def _spec(hco: HyperConverged, cluster: ClusterInfo) -> JSON:
    spec = hco.spec
    return compact(
        {
            "templateValidator": compact(
                {
                    "replicas": d.TEMPLATE_VALIDATOR_REPLICAS,
                    "placement": placement(spec.infra.node_placement),
                }
            ),
            "commonTemplates": compact(
                {
                    "namespace": spec.common_templates_namespace or d.COMMON_TEMPLATES_NAMESPACE,
                    "dataImportCronTemplates": golden_images(hco, cluster) or None,
                }
            ),
            "tlsSecurityProfile": tls.profile_json(spec),
            "tokenGenerationService": (
                {"enabled": True} if spec.feature_gates.deploy_vm_console_proxy else None
            ),
        }
    )


SSP = Operand(
    kind="SSP",
    api_version=d.OPERAND_API_VERSIONS["SSP"],
    component="schedule",
    jsonpatch_annotation=d.SSP_JSONPATCH_ANNOTATION,
    name=lambda hco: f"ssp-{hco.metadata.name}",
    namespaced=True,
    spec=_spec,
)

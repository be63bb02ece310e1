"""The cluster configuration the kinds read (`controlplane.clusterconfig`), taken from the
effective KubeVirt CR through the same functions on the read side and the write side
(`projections.hco.kubevirt_spec`, `kubevirt_configuration`): KubeVirt's defaults without a
CR, or where the CR holds something that is no object; HCO's derived values with one."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.clusterconfig import (
    BETA_GATES,
    ClusterConfig,
    MigrationConfig,
    WorkloadUpdateConfig,
)
from controlplane.hco.operands import ClusterInfo
from controlplane.hco.operands.kubevirt import KUBEVIRT
from events.api import hco_defaults as d
from events.api.hco import HyperConverged
from events.api.vmi_defaults import DEFAULT_POD_BINDING
from projections.hco import kubevirt_configuration, kubevirt_spec


@pytest.mark.parametrize("kubevirt", [
    None, {}, {"spec": None}, {"spec": []}, {"spec": {"configuration": None}},
    {"spec": {"configuration": "x", "workloadUpdateStrategy": None}},
], ids=["none", "empty", "null-spec", "list-spec", "null-configuration", "odd-values"])
def test_without_a_usable_cr_kubevirts_defaults_hold(kubevirt: dict[str, Any] | None) -> None:
    config = ClusterConfig(kubevirt)
    assert kubevirt_configuration(kubevirt) == config.configuration == {}
    assert config.feature_gates == BETA_GATES
    assert config.migrations == MigrationConfig()
    assert config.workload_updates == WorkloadUpdateConfig()
    assert (config.cpu_model, config.pod_binding) == ("", DEFAULT_POD_BINDING)


def test_the_cr_hco_derives_is_read_as_written() -> None:
    hco = HyperConverged()
    hco.spec.default_cpu_model = "Haswell"
    derived = KUBEVIRT.derive(hco, ClusterInfo())
    config = ClusterConfig(derived)
    assert kubevirt_spec(derived) is derived["spec"]
    assert config.configuration is derived["spec"]["configuration"]
    assert config.cpu_model == "Haswell"
    assert config.pod_binding == "masquerade"
    assert config.migrations.parallel_per_cluster == d.PARALLEL_MIGRATIONS_PER_CLUSTER
    assert config.workload_updates.methods == tuple(
        derived["spec"]["workloadUpdateStrategy"]["workloadUpdateMethods"])
    developer = derived["spec"]["configuration"]["developerConfiguration"]
    assert config.feature_gates >= frozenset(developer["featureGates"])

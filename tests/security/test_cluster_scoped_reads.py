"""The cluster's one-of-a-kind objects (the HyperConverged and its operands) are read at the
cluster scope, as their commands are decided: a grant in the namespace they show does not let
anyone read them; a cluster-wide grant does."""

from __future__ import annotations

from typing import Any

from events.authorization.policy import parse_policy
from events.language.query import Query
from projections.service import visible

HCO: dict[str, Any] = {
    "apiVersion": "hco.kubevirt.io/v1beta1", "kind": "HyperConverged",
    "metadata": {"name": "kubevirt-hyperconverged", "namespace": "kubevirt-hyperconverged"},
    "spec": {}}

POLICY = """
kind: RoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: local-admin, namespace: kubevirt-hyperconverged}
roleRef: {kind: ClusterRole, name: cluster-admin}
subjects: [{kind: User, name: local}]
---
kind: ClusterRoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: operator}
roleRef: {kind: ClusterRole, name: cluster-admin}
subjects: [{kind: User, name: operator}]
"""


def test_a_grant_in_the_namespace_an_hco_shows_does_not_read_it() -> None:
    policy = parse_policy(POLICY)
    for query in (Query(kind="HyperConverged"),
                  Query(kind="HyperConverged", name="kubevirt-hyperconverged")):
        assert visible(policy, "local", query, [HCO]) == []
        assert visible(policy, "operator", query, [HCO]) == [HCO]

"""Who may read the event log directly, as the generated NATS permissions say: it holds every
namespace and cloud-init secrets in clear, so only who may change every VM; a viewer of every
namespace, or an editor of one, asks the read service (which filters and redacts)."""

from __future__ import annotations

from events.authorization.accounts import users_for
from events.authorization.policy import parse_policy
from events.language.subjects import Layout

POLICY = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ops}
roleRef: {kind: ClusterRole, name: cluster-admin}
subjects: [{kind: User, name: ops}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: editors}
roleRef: {kind: ClusterRole, name: "kubevirt.io:edit"}
subjects: [{kind: User, name: editor}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: auditors}
roleRef: {kind: ClusterRole, name: "kubevirt.io:view"}
subjects: [{kind: User, name: auditor}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: tenant, namespace: tenant-a}
roleRef: {kind: ClusterRole, name: "kubevirt.io:edit"}
subjects: [{kind: User, name: tenant}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: scrapes}
roleRef: {kind: ClusterRole, name: "system:monitoring"}
subjects: [{kind: User, name: "system:anonymous"}]
"""


def test_only_who_may_change_every_vm_reads_the_log_directly() -> None:
    layout = Layout()
    users = {u.name: u for u in users_for(layout, parse_policy(POLICY), [])}
    direct_get = f"$JS.API.DIRECT.GET.{layout.events_stream}"
    readers = {name for name, user in users.items() if direct_get in user.publish}
    assert readers == {"controlplane", "projections", "ops", "editor"}
    assert "system:anonymous" not in users  # an HTTP-only user: no NATS identity

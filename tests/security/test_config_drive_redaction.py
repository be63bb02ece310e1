"""A cloudInitConfigDrive volume, admissible now as in KubeVirt, holds cloud-init secrets as
a cloudInitNoCloud one does: the read service shows them to no one who may not change the
VMI (here a node agent, which never may)."""

from __future__ import annotations

import msgspec

from events.api.manifest import decode_object
from events.authorization.policy import Policy
from events.language.messages import node_actor
from events.language.query import Query
from projections.service import REDACTED, visible

SECRET = "#cloud-config\npassword: hunter2\n"


def test_config_drive_user_and_network_data_are_redacted() -> None:
    vmi = decode_object({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "v"},
        "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}},
                            "devices": {"disks": [{"name": "ci", "disk": {}}]}},
                 "volumes": [{"name": "ci", "cloudInitConfigDrive": {
                     "userData": SECRET, "networkDataBase64": "bmV0d29yaw=="}}]}})
    item = {"metadata": {"namespace": "default", "name": "v"},
            "spec": msgspec.to_builtins(vmi)["spec"], "status": {"nodeName": "n1"}}
    [seen] = visible(Policy(), node_actor("n1"), Query(kind="VirtualMachineInstance"), [item])
    source = seen["spec"]["volumes"][0]["cloudInitConfigDrive"]
    assert source == {"userData": REDACTED, "networkDataBase64": REDACTED}

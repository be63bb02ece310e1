"""Fields KubeVirt admits that a virtbus guest runs without, through commands and read
models on the real store: the VMI is accepted and its `SpecHonoured` condition is False,
naming each such field and why; a VMI without them has no such condition."""

from __future__ import annotations

from typing import Any

from projections.cluster import render_vmi
from tests.store.helpers import SyncHandler
from tests.store.scheduling_helpers import Cluster

INERT: dict[str, Any] = {
    "dnsPolicy": "None",
    "dnsConfig": {"nameservers": ["10.0.0.53"]},
    "networks": [{"name": "default", "pod": {}}],
    "domain": {"resources": {"requests": {"memory": "1Gi"}}, "devices": {
        "tpm": {"persistent": True},
        "interfaces": [{"name": "default", "masquerade": {}, "ports": [{"port": 22}]}]}},
}


def conditions(c: Cluster, name: str) -> dict[str, dict[str, Any]]:
    view = c.state.vmi("default", name)
    assert view is not None
    return {cond["type"]: cond for cond in render_vmi(view)["status"]["conditions"]}


def test_what_a_guest_goes_without_is_said_in_a_condition(handler: SyncHandler) -> None:
    c = Cluster(handler)
    c.vmi("inert", INERT)
    c.vmi("plain")
    condition = conditions(c, "inert")["SpecHonoured"]
    assert (condition["status"], condition["reason"]) == ("False", "NotOnVirtbusNodes")
    assert condition["message"].split("; ") == [
        "spec.dnsPolicy/dnsConfig: a virtbus guest has no pod resolver to configure",
        "spec.domain.devices.interfaces[0].ports: interface 'default' is a tap without NAT, "
        "so no port is forwarded",
        "spec.domain.devices.tpm.persistent: the TPM state lives with the domain, which a "
        "stop removes",
    ]
    assert condition["lastTransitionTime"]
    assert "SpecHonoured" not in conditions(c, "plain")

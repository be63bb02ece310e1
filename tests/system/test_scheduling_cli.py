"""Node placement through the `virtbus` CLI against a real `virtbus up`: kubectl's label,
taint, cordon and uncordon, and a VM that waits, ErrorUnschedulable, until a node fits."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.system.test_cli import EXAMPLE, Cli, cli

__all__ = ["cli"]  # the fixture, shared with test_cli


def test_placement_through_the_cli(cli: Cli, tmp_path: Path) -> None:
    assert cli("label", "node", "node-1", "disk=ssd").stdout == "node/node-1 labeled\n"
    assert cli("label", "node", "node-1", "disk=ssd").stdout == "node/node-1 not labeled\n"
    refused = cli("label", "node", "node-1", "disk=hdd", ok=False)
    assert refused.stderr.strip() == \
        "error: 'disk' already has a value (ssd), and --overwrite is false"
    assert cli("taint", "node", "node-2", "dedicated=db:NoSchedule").stdout == \
        "node/node-2 tainted\n"
    assert cli("cordon", "node-1").stdout == "node/node-1 cordoned\n"
    assert cli("cordon", "node-1").stdout == "node/node-1 already cordoned\n"
    cli.until("get", "nodes", contains="node-1   Ready,SchedulingDisabled")

    vm = yaml.safe_load(EXAMPLE.read_text())
    vm["spec"]["template"]["spec"]["nodeSelector"] = {"disk": "ssd"}
    manifest = tmp_path / "vm.yaml"
    manifest.write_text(yaml.safe_dump(vm))
    cli("apply", "-f", str(manifest))
    cli.until("get", "vm", "testvm", contains="ErrorUnschedulable")
    vmi = yaml.safe_load(cli("get", "vmi", "testvm", "-o", "yaml").stdout)
    [condition] = [c for c in vmi["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False", "Unschedulable",
        "0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: db}, "
        "1 node(s) were unschedulable.")

    assert cli("uncordon", "node-1").stdout == "node/node-1 uncordoned\n"
    cli.until("get", "vm", "testvm", contains="Running")
    vmi = yaml.safe_load(cli("get", "vmi", "testvm", "-o", "yaml").stdout)
    assert vmi["status"]["nodeName"] == "node-1"
    assert cli("taint", "node", "node-2", "dedicated-").stdout == "node/node-2 untainted\n"

"""The lifecycle through the `virtbus` CLI against a real `virtbus up`, as a user types it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import pytest
import yaml

from tests.system.harness import WAIT_SECONDS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vm-cirros.yaml"


def read_line(proc: subprocess.Popen[str], on_timeout: Callable[[], None]) -> str:
    """The next line `proc` prints; after `WAIT_SECONDS` `on_timeout` is called (it must end
    the process), so a process that never prints fails the test instead of hanging it."""
    assert proc.stdout is not None
    watchdog = threading.Timer(WAIT_SECONDS, on_timeout)
    watchdog.start()
    try:
        return proc.stdout.readline()
    finally:
        watchdog.cancel()


class Cli:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __call__(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "controlplane.user.cli", *args], env=self.env,
                              capture_output=True, text=True, timeout=60, check=False)
        if ok:
            assert done.returncode == 0, done.stderr
        return done

    def until(self, *args: str, contains: str) -> str:
        """Run `args` until its output contains `contains` (a condition wait)."""
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            out = self(*args, ok=False).stdout
            if contains in out:
                return out
            time.sleep(0.1)  # poll interval of a condition wait
        raise AssertionError(f"`virtbus {' '.join(args)}` never showed {contains!r}")


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    env = {**os.environ, "VIRTBUS_CONTEXT": str(tmp_path / "context.json")}
    env.pop("VIRTBUS_NATS_URL", None)
    # Its own process group: whatever `up` started (nats-server, agents) can be killed with it.
    up = subprocess.Popen([sys.executable, "-m", "controlplane.user.cli", "up", "--data-dir",
                           str(tmp_path / "data"), "--nodes", "2"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          start_new_session=True)

    def kill_all() -> None:
        with suppress(ProcessLookupError):  # the whole group already gone
            os.killpg(up.pid, signal.SIGKILL)

    try:
        assert read_line(up, kill_all).startswith("virtbus is up")
        run = Cli(env)
        run.until("get", "nodes", contains="node-2   Ready")
        yield run
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        finally:
            kill_all()  # `up` stops its children on SIGINT; any still there do not outlive it
            up.wait()


def test_lifecycle_through_the_cli(cli: Cli, tmp_path: Path) -> None:
    assert "virtualmachine.kubevirt.io/testvm created" in cli("apply", "-f", str(EXAMPLE)).stdout
    # `apply` says "unchanged" only for what the read model already holds.
    cli.until("get", "vm", "testvm", contains="testvm")
    assert "unchanged" in cli("apply", "-f", str(EXAMPLE)).stdout
    cli.until("get", "vm", contains="Running   True")
    vmi = yaml.safe_load(cli("get", "vmi", "testvm", "-o", "yaml").stdout)
    assert vmi["status"]["phase"] == "Running" and vmi["status"]["nodeName"].startswith("node-")

    assert "was scheduled to stop" in cli("stop", "testvm").stdout
    cli.until("get", "vm", "testvm", contains="Stopped")
    refused = cli("stop", "testvm", ok=False)
    assert refused.returncode == 1 and refused.stderr == "error: VM is not running\n"
    cli("start", "testvm")
    cli.until("get", "vmi", contains="Running")
    cli("restart", "testvm")
    cli.until("get", "vm", "testvm", "-o", "json", contains='"restartCount": 1')

    # restartCount is the restart command's own event; the new VMI's comes steps later.
    history = json.loads(cli.until("history", "vm", "testvm", "-o", "json",
                                   contains="VirtualMachineStartRequestDone"))
    assert [h["type"] for h in history] == [
        "VirtualMachineCreated", "VirtualMachineRunStrategyChanged",
        "VirtualMachineRunStrategyChanged", "VirtualMachineRestartRequested",
        "VirtualMachineStartRequestDone"]  # the VMI the restart asked for was created
    assert all(h["actor"].startswith("user:") and h["command_id"] for h in history[:-1])
    assert history[-1]["actor"] == "system:controller:vm"
    created = history[0]["sequence"]
    past = yaml.safe_load(cli("get", "vm", "testvm", "--at", str(created), "-o", "yaml").stdout)
    assert past["spec"]["runStrategy"] == "Always" and past["metadata"]["generation"] == 1

    watched = _first_lines(cli, 5)
    assert [w["event"] for w in watched] == [h["type"] for h in history]

    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("cores: 1", "corez: 1"))
    refused = cli("apply", "-f", str(bad), ok=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == \
        "error: spec.template.spec.domain.cpu: Object contains unknown field `corez`"

    assert 'deleted' in cli("delete", "vm", "testvm").stdout
    cli.until("get", "vm", contains="No resources found")


def test_instancetypes_through_the_cli(cli: Cli) -> None:
    """kubectl's names and short names for the instancetype.kubevirt.io kinds, `-o yaml`,
    and a VM's pinned revision shown in its spec and status."""
    examples = EXAMPLE.parent
    applied = cli("apply", "-f", str(examples / "common-instancetypes.yaml")).stdout
    assert "virtualmachineclusterinstancetype.instancetype.kubevirt.io/u1.small created" \
        in applied
    # The file's last document: once the read model holds it, it holds all six (log order).
    cli.until("get", "vmcf", "cx1.large", contains="cx1.large")
    assert "unchanged" in cli("apply", "-f", str(examples / "common-instancetypes.yaml")).stdout
    for name in ("vmclusterinstancetype", "vmclusterinstancetypes", "vmcf", "vmcfs",
                 "virtualmachineclusterinstancetypes"):
        assert cli("get", name).stdout.splitlines()[0].split() == ["NAME", "AGE"]
    table = cli("get", "vmcf").stdout
    assert [line.split()[0] for line in table.splitlines()[1:]] == [
        "cx1.large", "o1.medium", "u1.medium", "u1.micro", "u1.nano", "u1.small"]
    small = yaml.safe_load(cli("get", "vmcf", "u1.small", "-o", "yaml").stdout)
    assert small["apiVersion"] == "instancetype.kubevirt.io/v1beta1"
    assert small["spec"] == {"cpu": {"guest": 1}, "memory": {"guest": "2Gi"}}
    assert "namespace" not in small["metadata"]

    cli("apply", "-f", str(examples / "vm-cirros-csmall.yaml"))
    for name in ("vminstancetype", "vmf", "virtualmachineinstancetype"):
        cli.until("get", name, contains="csmall")
    assert "No resources found" in cli("get", "vmpref").stdout
    cli("start", "vm-cirros-csmall")
    first = yaml.safe_load(cli.until("get", "vmi", "vm-cirros-csmall", "-o", "yaml",
                                     contains="phase: Running"))
    shown = cli.until("get", "vm", "vm-cirros-csmall", "-o", "yaml", contains="revisionName")
    vm = yaml.safe_load(shown)
    revision = vm["spec"]["instancetype"]["revisionName"]
    assert vm["status"]["instancetypeRef"] == {
        "name": "csmall", "kind": "VirtualMachineInstancetype",
        "controllerRevisionRef": {"name": revision}}
    # Its VMI ran before the VM was read: the VM shows it, as `kubectl get vm -o yaml` does.
    assert vm["status"]["printableStatus"] == "Running"
    [ready] = [c for c in vm["status"]["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "True"
    assert revision in cli("get", "controllerrevision").stdout
    assert cli("delete", "vmf", "csmall").stdout.strip() == \
        'virtualmachineinstancetype.instancetype.kubevirt.io "csmall" deleted'
    # The instancetype is gone; the pinned revision still sizes the VMI that replaces it.
    cli("restart", "vm-cirros-csmall")
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        vmi = yaml.safe_load(cli("get", "vmi", "vm-cirros-csmall", "-o", "yaml", ok=False).stdout
                             or "{}") or {}
        if vmi.get("metadata", {}).get("uid") not in (None, first["metadata"]["uid"]) \
                and vmi["status"]["phase"] == "Running":
            break
        time.sleep(0.1)  # poll interval of a condition wait
    else:
        raise AssertionError("the restarted VM's new VMI never ran")
    assert vmi["spec"]["domain"]["memory"] == {"guest": "128Mi"}


def test_annotate_and_patch_through_the_cli(cli: Cli) -> None:
    """`annotate` and `patch` send one `patch` command each, applied by the control plane to
    the object as it is when it decides it (the client reads nothing): two annotations sent
    at once both land (issue 33: one was lost, 5 times out of 5)."""
    cli("apply", "-f", str(EXAMPLE))
    annotated = cli("annotate", "vm", "testvm", "team=blue").stdout
    assert annotated == "virtualmachine/testvm annotated\n"
    vm = json.loads(cli.until("get", "vm", "testvm", "-o", "json", contains='"team": "blue"'))
    assert vm["metadata"]["annotations"]["team"] == "blue"
    refused = cli("annotate", "vm", "testvm", "team=red", ok=False)
    assert (refused.returncode, refused.stderr) == (
        1, "error: metadata.annotations.team: is already set; pass --overwrite to replace it\n")
    cli("annotate", "vm", "testvm", "team=red", "--overwrite")
    cli("patch", "vm", "testvm", "--type", "json", "-p",
        '[{"op": "add", "path": "/metadata/labels", "value": {"tier": "web"}}]')
    vm = json.loads(cli.until("get", "vm", "testvm", "-o", "json", contains='"tier": "web"'))
    assert vm["metadata"]["annotations"]["team"] == "red"
    failed = cli("patch", "vm", "testvm", "--type", "json", "-p",
                 '[{"op": "test", "path": "/spec/runStrategy", "value": "Manual"}]', ok=False)
    assert failed.returncode == 1 and failed.stderr.startswith("error: /spec/runStrategy: ")
    for n in range(5):
        at_once = [subprocess.Popen(
            [sys.executable, "-m", "controlplane.user.cli", "annotate", "vm", "testvm",
             f"{who}{n}=x"], env=cli.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True) for who in "ab"]
        for proc in at_once:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
        for who in "ab":
            cli.until("get", "vm", "testvm", "-o", "json", contains=f'"{who}{n}": "x"')


def _first_lines(cli: Cli, count: int) -> list[dict[str, object]]:
    """The first `count` changes of a `watch --since 1` (which then stays live)."""
    watch = subprocess.Popen(
        [sys.executable, "-m", "controlplane.user.cli", "watch", "vm", "testvm", "--since", "1",
         "-o", "json"], env=cli.env, stdout=subprocess.PIPE, text=True)
    try:
        return [json.loads(read_line(watch, watch.kill)) for _ in range(count)]
    finally:
        watch.terminate()
        watch.wait(timeout=10)

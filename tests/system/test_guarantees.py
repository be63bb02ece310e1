"""The behaviours the foundation promises: bad input changes nothing, concurrent writers
all get a definite outcome, every event names its actor and command, and kill -9 of the
control plane loses no accepted command and launches nothing twice."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest

from controlplane.user.client import Client, CommandRejected
from events.api.errors import InvalidSpec
from events.language.messages import Outcome
from tests.system.harness import (
    System,
    command_topics_since,
    domains,
    eventually,
    last_sequence,
    vm_manifest,
    vmi_phase,
)

BAD_MANIFESTS: list[tuple[dict[str, Any], str, str]] = [
    ({"kind": "VirtualMachinePool", "apiVersion": "kubevirt.io/v1"}, "kind", "must be one of"),
    ({**vm_manifest("x"), "apiVersion": "kubevirt.io/v2"}, "apiVersion", "kubevirt.io/v1"),
    ({**vm_manifest("x"), "metadata": {"name": "Not_A_Label"}}, "metadata.name", "DNS-1123"),
    ({**vm_manifest("x"), "metadata": {"name": "ok", "namespace": "Bad.NS"}},
     "metadata.namespace", "DNS-1123"),
    ({**vm_manifest("x"), "spec": {"runStrategy": "Always", "template": {"spec": {
        "domain": {"cpu": {"coress": 2}, "devices": {}}}}}},
     "spec.template.spec.domain.cpu", "unknown field `coress`"),
    ({**vm_manifest("x"), "spec": {"running": True, "runStrategy": "Always",
                                   "template": {"spec": {"domain": {}}}}},
     "spec.running", "cannot be set together"),
    ({**vm_manifest("x"), "spec": {"runStrategy": "Sometimes",
                                   "template": {"spec": {"domain": {}}}}},
     "spec.runStrategy", "must be one of Always, Halted, Manual"),
    ({**vm_manifest("x"), "spec": {"runStrategy": "WaitAsReceiver",
                                   "template": {"spec": {"domain": {}}}}},
     "spec.runStrategy", "not supported yet"),
]


async def test_bad_input_is_refused_with_field_and_rule_and_appends_nothing(
        vb: Client) -> None:
    """...nothing but each refusal, recorded so that it is final."""
    before = await last_sequence(vb)
    for manifest, field, rule in BAD_MANIFESTS:
        # The client refuses before sending...
        with pytest.raises(InvalidSpec) as refused:
            await vb.apply(manifest)
        assert refused.value.field == field and rule in refused.value.rule
        # ...and the control plane refuses on its own when a command bypasses the client.
        outcome = await vb.run(vb.command("VirtualMachine", "apply", manifest=manifest),
                               check=False)
        assert not outcome.accepted
        assert outcome.field == field and rule in outcome.reason, outcome
    with pytest.raises(CommandRejected, match='virtualmachine "default/nobody" not found'):
        await vb.act("VirtualMachine", "start", "default", "nobody")
    outcome = await vb.run(vb.command("VirtualMachine", "teleport", "default", "x"), check=False)
    assert not outcome.accepted and outcome.field == "verb"
    # One bad document in a multi-document apply submits none of them.
    with pytest.raises(InvalidSpec, match="document 1"):
        await vb.apply(vm_manifest("fine"), BAD_MANIFESTS[2][0])
    refusals = len(BAD_MANIFESTS) + 2
    assert await command_topics_since(vb, before) == ["CommandRejected.v1"] * refusals
    assert await vb.query("VirtualMachine") == []


PATCH_ROUNDS = 30


async def test_two_clients_annotating_one_vm_at_once_lose_neither(
        system: System, vb: Client) -> None:
    """Issue 33: two annotations sent at once, from two clients on connections of their own,
    round after round: the control plane patches the VM as it is when it decides each, so
    both are kept every round (a client that read, patched and applied lost one)."""
    await vb.apply(vm_manifest("noted", "Halted"))
    clients = [await Client.connect(system.nats_url, system.prefix, actor=f"user:{who}")
               for who in ("ann", "bob")]
    try:
        for n in range(PATCH_ROUNDS):
            outcomes = await asyncio.gather(*[
                c.patch("VirtualMachine", "default", "noted",
                        {"metadata": {"annotations": {f"{who}-{n}": "x"}}})
                for c, who in zip(clients, ("ann", "bob"), strict=True)])
            last = max(seq for o in outcomes for seq in o.sequences)
            vm = await vb.get("VirtualMachine", "default", "noted", after=last)
            assert {f"ann-{n}", f"bob-{n}"} <= vm["metadata"]["annotations"].keys(), n
    finally:
        for c in clients:
            await c.close()


async def test_concurrent_writers_each_get_an_outcome_and_nothing_is_lost(
        system: System, vb: Client) -> None:
    await vb.apply(vm_manifest("shared", "Halted"))
    others = [await Client.connect(system.nats_url, system.prefix, actor=f"user:u{i}")
              for i in range(4)]
    try:
        memories = [f"{64 + 8 * i}Mi" for i in range(8)]
        results: list[Outcome] = await asyncio.gather(*[
            _apply_one(others[i % 4], vm_manifest("shared", "Halted", memory=m))
            for i, m in enumerate(memories)])
    finally:
        for c in others:
            await c.close()
    assert all(r.accepted for r in results)
    # Definite: the outcome each writer got is the one kept for its command.
    assert len({r.command_id for r in results}) == len(results)
    for r in results:
        assert await vb.outcome(r.command_id) == r
    # A write that changed nothing (no sequences) found the VM already at its memory: with
    # every write's memory different, only the manifest's own 64Mi, before any other change.
    assert all(m == "64Mi" for m, r in zip(memories, results, strict=True) if not r.sequences)
    changed = [(m, r) for m, r in zip(memories, results, strict=True) if r.sequences]
    history = await vb.history("VirtualMachine", "default", "shared")
    updates = [h for h in history if h.type == "VirtualMachineUpdated"]
    # Every accepted change is in the log once, in some order; none overwrote another unseen.
    assert len(updates) == len(changed)
    assert sorted(u.sequence for u in updates) == sorted(r.sequences[0] for _, r in changed)
    last = max(u.sequence for u in updates)
    vm = await vb.get("VirtualMachine", "default", "shared", after=last)
    assert vm["metadata"]["generation"] == 1 + len(updates)
    assert history[-1].sequence == last
    assert any(c["path"].endswith("/memory") for c in history[-1].changes)
    # The VM holds what the last applied write (the highest sequence) asked for.
    last_write = max(changed, key=lambda mr: max(mr[1].sequences))[0]
    assert vm["spec"]["template"]["spec"]["domain"]["resources"]["requests"]["memory"] \
        == last_write


async def _apply_one(client: Client, manifest: dict[str, Any]) -> Outcome:
    [outcome] = await client.apply(manifest)
    return outcome


async def test_every_event_names_its_actor_and_command(vb: Client) -> None:
    [created] = await vb.apply(vm_manifest("audited"))
    await eventually(lambda: vmi_phase(vb, "audited", "Running"), what="VMI Running")
    stop = await vb.act("VirtualMachine", "stop", "default", "audited")
    vm_history = await vb.history("VirtualMachine", "default", "audited")
    assert [(h.actor, h.type) for h in vm_history] == [
        ("user:alice", "VirtualMachineCreated"),
        ("user:alice", "VirtualMachineRunStrategyChanged"),
    ]
    assert vm_history[0].sequence in created.sequences
    assert vm_history[1].sequence in stop.sequences
    assert all(h.command_id for h in vm_history)
    vmi_history = await vb.history("VirtualMachineInstance", "default", "audited")
    actors = {h.actor for h in vmi_history}
    assert {"system:controller:vm", "system:controller:scheduler"} <= actors
    assert any(a.startswith("system:node:") for a in actors)
    # Every event that followed from the user's apply carries it as the correlation id,
    # through the VM controller, the scheduler and the node's report.
    started = [h for h in vmi_history if h.sequence < vm_history[1].sequence]
    assert {h.correlation_id for h in started} == {vm_history[0].command_id}


async def test_kill_9_of_the_control_plane_loses_no_command_and_launches_nothing_twice(
        system: System, vb: Client) -> None:
    names = [f"k{i}" for i in range(6)]
    commands = [vb.command("VirtualMachine", "apply", manifest=vm_manifest(n)) for n in names]
    for command in commands[:3]:
        await vb.submit(command)
    system.kill("controlplane")
    for command in commands[3:]:
        await vb.submit(command)  # accepted by the stream while nobody processes it
    system.start("controlplane")
    outcomes = [await vb.outcome(c.id) for c in commands]
    assert all(o.accepted for o in outcomes), outcomes
    for name in names:
        await eventually(partial(vmi_phase, vb, name, "Running"), what=f"{name} Running")
    # Resubmitting a command already applied answers with its first outcome.
    await vb.submit(commands[0])
    assert (await vb.outcome(commands[0].id)).sequences == outcomes[0].sequences
    system.kill("controlplane")
    system.start("controlplane")
    await vb.apply(vm_manifest("after-restart"))
    await eventually(lambda: vmi_phase(vb, "after-restart", "Running"), what="later VM")
    guests = [d for node in ("node-1", "node-2") for d in await domains(vb, node)]
    vmis = await vb.query("VirtualMachineInstance")
    assert sorted(d.uid for d in guests) == sorted(v["metadata"]["uid"] for v in vmis)
    assert len(guests) == len(names) + 1

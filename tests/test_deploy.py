"""deploy/: every NATS config passes the real nats-server's config check, every YAML parses,
and accounts.conf gives each role what the design's NATS layout says, and no more."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from nats.aio.client import Client
from nats.js.api import ConsumerConfig

from events.connect import connect, inbox_prefix
from events.query import query_subject
from events.server import EmbeddedNats, nats_server_binary
from events.streams import ensure_all
from events.subjects import Layout
from tests.system.harness import eventually

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
NATS_CONFS = sorted((DEPLOY / "nats").rglob("*.conf"))
YAMLS = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
# `$NAME` outside quotes: an environment variable the server must be given.
_ENV_REF = re.compile(r'^[^"#\n]*?\$([A-Za-z_][A-Za-z0-9_]*)', re.MULTILINE)
PASSWORD = "test-password"


def _env_for(*texts: str) -> dict[str, str]:
    names = {name for text in texts for name in _ENV_REF.findall(text)}
    return {**os.environ, **dict.fromkeys(names, PASSWORD)}


def _check(conf: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(nats_server_binary()), "-t", "-c", str(conf)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )


def test_every_config_is_found() -> None:
    names = {str(p.relative_to(DEPLOY / "nats")) for p in NATS_CONFS}
    assert {"single.conf", "accounts.conf", "cluster/n1.conf", "cluster/n2.conf",
            "cluster/n3.conf"} <= names
    assert any(p.parent.name == "kubernetes" for p in YAMLS)


@pytest.mark.parametrize("conf", NATS_CONFS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_nats_config_is_valid(conf: Path) -> None:
    result = _check(conf, _env_for(conf.read_text()))
    assert result.returncode == 0, result.stderr
    assert "is valid" in result.stderr


def test_accounts_conf_refuses_to_start_without_passwords() -> None:
    conf = DEPLOY / "nats" / "accounts.conf"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTBUS_NATS_")}
    result = _check(conf, env)
    assert result.returncode != 0
    assert "VIRTBUS_NATS_" in result.stderr


@pytest.mark.parametrize("server", ["single.conf", "cluster/n1.conf"])
def test_server_configs_with_accounts_included(server: str, tmp_path: Path) -> None:
    """The documented way to turn on authentication: include accounts.conf beside it."""
    shutil.copytree(DEPLOY / "nats", tmp_path / "nats")
    conf = tmp_path / "nats" / server
    include = "../accounts.conf" if "/" in server else "./accounts.conf"
    conf.write_text(f"{conf.read_text()}\ninclude {include}\n")
    result = _check(conf, _env_for((DEPLOY / "nats" / "accounts.conf").read_text()))
    assert result.returncode == 0, result.stderr


def test_cluster_nodes_agree() -> None:
    """Three distinct nodes of one cluster "virtbus", each routing to all three."""
    texts = [(DEPLOY / "nats" / "cluster" / f"n{i}.conf").read_text() for i in (1, 2, 3)]
    names = {re.search(r"^server_name:\s*(\S+)", t, re.M).group(1) for t in texts}  # type: ignore[union-attr]
    assert names == {"n1", "n2", "n3"}
    for text in texts:
        assert re.search(r"^\s*name:\s*virtbus\s*$", text, re.M)
        assert len(set(re.findall(r"nats-route://127\.0\.0\.1:(\d+)", text))) == 3
    stores = {re.search(r"store_dir:\s*(\S+)", t).group(1) for t in texts}  # type: ignore[union-attr]
    assert len(stores) == 3


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, f"{path} holds no document"
    for doc in docs:
        assert isinstance(doc, dict)
        assert doc.get("apiVersion") and doc.get("kind"), f"{path}: {doc!r:.80}"


def _manifests() -> list[dict[str, Any]]:
    return [d for p in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
            for d in yaml.safe_load_all(p.read_text()) if d is not None]


def test_kubernetes_manifests_shape() -> None:
    by_kind: dict[tuple[str, str], dict[str, Any]] = {
        (d["kind"], d["metadata"]["name"]): d for d in _manifests()
    }
    nats_sts = by_kind[("StatefulSet", "virtbus-nats")]
    assert nats_sts["spec"]["replicas"] == 3
    assert nats_sts["spec"]["volumeClaimTemplates"]
    headless = by_kind[("Service", nats_sts["spec"]["serviceName"])]
    assert headless["spec"]["clusterIP"] == "None"
    assert by_kind[("Deployment", "virtbus-controlplane")]["spec"]["replicas"] == 2
    agent = by_kind[("DaemonSet", "virtbus-nodeagent")]["spec"]["template"]["spec"]
    container = agent["containers"][0]
    assert "$(NODE_NAME)" in container["args"]
    node_env = next(e for e in container["env"] if e["name"] == "NODE_NAME")
    assert node_env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert any(v["hostPath"]["path"] == "/var/run/libvirt" for v in agent["volumes"])
    assert not agent.get("hostPID")
    assert ("Service", "virtbus-projections") in by_kind


def test_kubernetes_nats_config_is_valid(tmp_path: Path) -> None:
    config_map = next(
        d for d in _manifests()
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "virtbus-nats-config"
    )
    conf = tmp_path / "nats.conf"
    conf.write_text(config_map["data"]["nats.conf"])
    result = _check(conf, {**os.environ, "POD_NAME": "virtbus-nats-0"})
    assert result.returncode == 0, result.stderr


# --- accounts.conf, enforced by a real server -------------------------------------------

Refusals = list[str]


async def _connect(url: str, user: str) -> tuple[Client, Refusals]:
    refusals: Refusals = []

    async def on_error(e: Exception) -> None:
        refusals.append(str(e))

    nc = await connect(url.replace("nats://", f"nats://{user}:{PASSWORD}@"), user,
                       error_cb=on_error, allow_reconnect=False)
    return nc, refusals


async def _refused(refusals: Refusals, subject: str, op: Callable[[], Awaitable[Any]]) -> None:
    """`op` fails, and the server said why: a permissions violation naming `subject`."""
    # The server drops a refused message and says so asynchronously; the request times out.
    with pytest.raises(Exception):  # noqa: B017
        await op()
    expected = f'permissions violation for publish to "{subject}"'.lower()
    assert any(expected in r.lower() for r in refusals), refusals


@pytest.fixture
def secured_nats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A server on accounts.conf; its passwords are in the environment it inherits."""
    shutil.copy(DEPLOY / "nats" / "accounts.conf", tmp_path / "accounts.conf")
    (tmp_path / "server.conf").write_text("include ./accounts.conf\n")
    for name, value in _env_for((DEPLOY / "nats" / "accounts.conf").read_text()).items():
        monkeypatch.setenv(name, value)
    with EmbeddedNats(tmp_path / "data", config=tmp_path / "server.conf") as server:
        yield server.url


async def test_accounts_permissions_per_role(secured_nats: str) -> None:
    url, layout, short = secured_nats, Layout(), 1.0

    # control plane: creates everything, writes events and node commands, not commands
    cp, cp_refusals = await _connect(url, "controlplane")
    js = cp.jetstream()
    await ensure_all(js, layout)
    await js.publish(layout.aggregate_subject("vm.default.a"), b"{}")
    await js.publish(layout.node_subject("n1", "launch"), b"n1")
    await (await js.key_value(layout.outcomes_bucket)).put("c1", b"accepted")
    subject = layout.command_subject("cp", "vm", "start")
    await _refused(cp_refusals, subject, lambda: js.publish(subject, b"", timeout=short))

    # client: commands and queries in, events and outcomes out, nothing else
    client, client_refusals = await _connect(url, "client")
    cjs = client.jetstream(timeout=2)
    await cjs.publish(layout.command_subject("alice", "vm", "start"), b"{}")
    outcomes = await cjs.key_value(layout.outcomes_bucket)
    entry = await outcomes.get("c1")
    assert entry.value == b"accepted"
    watcher = await outcomes.watch("c1")
    update = await watcher.updates(timeout=5)
    assert update is not None and update.value == b"accepted"
    await watcher.stop()
    follow = await cjs.subscribe(layout.events_filter(), ordered_consumer=True)
    assert (await follow.next_msg(timeout=5)).subject == "virtbus.ev.vm.default.a"
    await follow.unsubscribe()
    subject = layout.aggregate_subject("vm.default.b")
    await _refused(client_refusals, subject, lambda: cjs.publish(subject, b"", timeout=short))
    await _refused(client_refusals, "$KV.VIRTBUS_OUTCOMES.c1",
                   lambda: outcomes.put("c1", b"forged"))

    # node agent n1: its own commands, reports and heartbeat only
    n1, n1_refusals = await _connect(url, "node-n1")
    njs = n1.jetstream(timeout=2)
    queue = await njs.pull_subscribe(layout.node_filter("n1"), durable="agent-n1",
                                     stream=layout.node_stream)
    [msg] = await queue.fetch(1, timeout=5)
    assert msg.data == b"n1"
    await msg.ack()
    await njs.publish(layout.report_subject("n1", "vmi"), b"{}")
    heartbeats = await njs.key_value(layout.heartbeats_bucket)
    await heartbeats.put("n1", b"alive")
    await _refused(n1_refusals, "$KV.VIRTBUS_HEARTBEATS.n2", lambda: heartbeats.put("n2", b"x"))
    subject = layout.report_subject("n2", "vmi")
    await _refused(n1_refusals, subject, lambda: njs.publish(subject, b"", timeout=short))
    for name, node in (("agent-n2", "n2"), ("agent-n1", "n2")):
        config = ConsumerConfig(name=name, durable_name=name,
                                filter_subject=layout.node_filter(node))
        subject = f"$JS.API.CONSUMER.CREATE.VIRTBUS_NODE.{name}.{layout.node_filter(node)}"
        await _refused(n1_refusals, subject,
                       partial(njs.add_consumer, layout.node_stream, config, timeout=short))
    await _refused(n1_refusals, "$JS.API.CONSUMER.MSG.NEXT.VIRTBUS_NODE.agent-n2",
                   lambda: n1.request("$JS.API.CONSUMER.MSG.NEXT.VIRTBUS_NODE.agent-n2",
                                      b"1", timeout=short))

    # projections answer queries; the client's request reaches them
    proj, _ = await _connect(url, "projections")

    async def answer(request: Any) -> None:
        await request.respond(b"answer")

    await proj.subscribe(f"{layout.query_root}.>", queue="projections", cb=answer)
    await (await proj.jetstream().key_value(layout.checkpoints_bucket)).put("p", b"1")
    reply = await client.request(f"{layout.query_root}.vms", b"", timeout=5)
    assert reply.data == b"answer"

    await asyncio.gather(*(nc.close() for nc in (cp, client, n1, proj)))


def test_inbox_prefix_is_the_users_own() -> None:
    assert inbox_prefix("nats://node-n1:pw@h:4222,nats://node-n1:pw@g:4222") == "_INBOX.node-n1"
    assert inbox_prefix("nats://h:4222") == "_INBOX"
    assert inbox_prefix("nats://s3cr3t-token@h:4222") == "_INBOX"  # never a token in a subject


async def test_no_role_reads_another_roles_replies(secured_nats: str) -> None:
    n1, refusals = await _connect(secured_nats, "node-n1")
    await n1.subscribe("_INBOX.controlplane.>")
    expected = 'permissions violation for subscription to "_inbox.controlplane.>"'

    async def refused() -> bool:
        return any(expected in r.lower() for r in refusals)

    await eventually(refused, timeout=10, what="the server's refusal")
    await n1.close()


async def test_node_agent_asks_the_read_api_which_vmis_are_its_own(secured_nats: str) -> None:
    """At start an agent reads the events stream's last sequence and queries at least up to
    it; it still reads no events (a Direct Get on the events stream is refused)."""
    layout = Layout()
    cp, _ = await _connect(secured_nats, "controlplane")
    await ensure_all(cp.jetstream(), layout)
    proj, _ = await _connect(secured_nats, "projections")

    async def answer(request: Any) -> None:
        await request.respond(b"answer")

    await proj.subscribe(query_subject(layout), queue="projections", cb=answer)
    n1, n1_refusals = await _connect(secured_nats, "node-n1")
    reply = await n1.request(query_subject(layout), b"", timeout=5)
    assert reply.data == b"answer"
    await n1.jetstream(timeout=2).stream_info(layout.events_stream)
    subject = f"$JS.API.DIRECT.GET.{layout.events_stream}"
    await _refused(n1_refusals, subject, partial(n1.jetstream(timeout=1.0).get_msg,
                                                 layout.events_stream, seq=1, direct=True))
    await asyncio.gather(cp.close(), proj.close(), n1.close())

"""deploy/: every NATS config passes the real nats-server's config check, every YAML parses,
and accounts.conf gives each role what the design's NATS layout says, and no more."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig
from nats.js.kv import KeyValue

from controlplane.controllers.dispatcher import WorkConsumers
from controlplane.user.client import outcomes_bucket
from events.authorization import accounts as authorization
from events.authorization.accounts import ADMIN_USER, CONTROLPLANE_USER
from events.jetstream.connect import inbox_prefix
from events.jetstream.directget import last_by_subject, read_all
from events.jetstream.server import nats_server_binary
from events.jetstream.streams import ensure_all, work_consumer
from events.language.messages import node_actor
from events.language.query import Query, ask, query_subject
from tests.security import conftest as security
from tests.system.harness import eventually

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
NATS_CONFS = sorted((DEPLOY / "nats").rglob("*.conf"))
YAMLS = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
Refusals = security.Refusals
_connect = security.connect_as
_env_for = security.env_for
secured_nats = security.secured_nats  # the fixtures, shared with tests/security
store = security.store
Store = security.Store
_refused = security.refused
ACCOUNTS_CONF = security.ACCOUNTS_CONF
POLICY = security.POLICY
SHORT = security.SHORT
WEB, OTHER = security.WEB, security.OTHER


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


def test_accounts_conf_is_valid() -> None:
    """The server configs, which name TLS files, are checked with certificates in place by
    tests/test_tls.py, with and without this file included."""
    conf = DEPLOY / "nats" / "accounts.conf"
    result = _check(conf, _env_for(conf.read_text()))
    assert result.returncode == 0, result.stderr
    assert "is valid" in result.stderr


def test_accounts_conf_refuses_to_start_without_passwords() -> None:
    conf = DEPLOY / "nats" / "accounts.conf"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTBUS_NATS_")}
    result = _check(conf, env)
    assert result.returncode != 0
    assert "VIRTBUS_NATS_" in result.stderr


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


# --- accounts.conf, enforced by a real server -------------------------------------------

def test_accounts_conf_is_what_the_policy_renders(capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped file is `python -m events.authorization`'s output for the shipped policy."""
    assert authorization.main(["--policy", str(POLICY), "--node", "n1", "--node", "n2",
                               "--node", "n3"]) == 0
    assert capsys.readouterr().out == ACCOUNTS_CONF.read_text()


async def test_admin_creates_streams_and_writes_nothing(store: Store) -> None:
    admin, refusals = await store.connect(ADMIN_USER)
    await ensure_all(admin.jetstream(), store.layout)  # all there: looked up, left alone
    subject = store.layout.aggregate_subject(WEB)
    await _refused(refusals, subject,
                   lambda: admin.jetstream().publish(subject, b"", timeout=SHORT))


async def test_controlplane_appends_dispatches_and_decides(store: Store) -> None:
    layout = store.layout
    cp, refusals = await store.connect(CONTROLPLANE_USER)
    js = cp.jetstream()
    assert (await js.publish(layout.aggregate_subject(OTHER), b"{}")).stream \
        == layout.events_stream
    assert (await js.publish(layout.node_subject("n1", "launch"), b"n1")).stream \
        == layout.node_stream
    await (await js.key_value(layout.outcomes_bucket)).put("operator.c1", b"accepted")
    for subject in (layout.command_subject("operator", "vm", "start"),
                    layout.report_subject("n1", "vmi")):
        await _refused(refusals, subject, partial(js.publish, subject, b"", timeout=SHORT))


async def test_controlplane_cannot_shrink_the_log(store: Store) -> None:
    """Issue 8, finding 7: an update to `max_msgs: 5` dropped the events; stream updates are
    the admin's alone, and the events stay."""
    layout = store.layout
    cp, refusals = await store.connect(CONTROLPLANE_USER)
    js = cp.jetstream(timeout=SHORT)
    for i in range(7):
        await js.publish(layout.aggregate_subject(f"vm.default.n{i}"), b"{}")
    before = await store.stored(cp)
    assert before[layout.events_stream] == 8
    shrunk = dataclasses.replace((await js.stream_info(layout.events_stream)).config,
                                 max_msgs=5)
    await _refused(refusals, f"$JS.API.STREAM.UPDATE.{layout.events_stream}",
                   partial(js.update_stream, shrunk))
    assert await store.stored(cp) == before


async def _arrives(arrival: Subscription, outcomes: KeyValue, key: str) -> bytes:
    """The control plane's put of `key` reaches `arrival` (through the stream import, whose
    interest may follow the subscription by a moment)."""
    await outcomes.put(key, b"accepted")
    return bytes((await arrival.next_msg(timeout=SHORT)).data)


async def test_a_person_commands_and_reads_under_its_own_name(store: Store) -> None:
    """`operator` (cluster-admin) reads the log itself; `alice` (one namespace) only through
    the read service. Each commands and reads outcomes under its own name only."""
    layout = store.layout
    cp, _ = await store.connect(CONTROLPLANE_USER)
    outcomes = await cp.jetstream().key_value(layout.outcomes_bucket)
    for person in ("operator", "alice"):
        nc, refusals = await store.connect(person)
        js = nc.jetstream(timeout=2)
        ack = await js.publish(layout.command_subject(person, "vm", "start"), b"{}")
        assert ack.stream == layout.commands_stream
        arrival = await nc.subscribe(f"$KV.{layout.outcomes_bucket}.{person}.c1")
        decided = partial(_arrives, arrival, outcomes, f"{person}.c1")
        assert await eventually(decided, timeout=10, what="the outcome's arrival") \
            == b"accepted"
        mine = outcomes_bucket(js, layout)
        assert (await mine.get(f"{person}.c1")).value == b"accepted"
        # No stream's info: its body's `subjects_filter` would list every key and object.
        info = f"$JS.API.STREAM.INFO.KV_{layout.outcomes_bucket}"
        await _refused(refusals, info, partial(nc.request, info, b'{"subjects_filter": ">"}',
                                               timeout=SHORT))
        answer = await ask(nc, layout, Query(kind="VirtualMachine"), person)
        assert answer.error == ""

        forged = layout.command_subject("bob", "vm", "stop")
        await _refused(refusals, forged, partial(js.publish, forged, b"", timeout=SHORT))
        event = layout.aggregate_subject(OTHER)
        await _refused(refusals, event, partial(js.publish, event, b"", timeout=SHORT))
        await _refused(refusals, f"$KV.{layout.outcomes_bucket}.{person}.c1",
                       partial(mine.put, f"{person}.c1", b"forged"))

    operator, _ = await store.connect("operator")
    [stored] = await read_all(operator, layout.events_stream, layout.aggregate_subject(WEB))
    assert stored.data == b"{}"

    alice, refusals = await store.connect("alice")
    await _refused(refusals, f"$JS.API.DIRECT.GET.{layout.events_stream}",
                   partial(alice.jetstream(timeout=SHORT).get_msg, layout.events_stream,
                           seq=1, direct=True))


async def test_a_node_agent_takes_its_own_work_only(store: Store) -> None:
    layout = store.layout
    cp, _ = await store.connect(CONTROLPLANE_USER)
    await WorkConsumers(cp, layout).ensure("n1")  # the control plane makes it
    await cp.jetstream().publish(layout.node_subject("n1", "launch"), b"n1")
    n1, refusals = await store.connect("node-n1")
    js = n1.jetstream(timeout=2)
    consumer = work_consumer("n1")
    queue = await js.pull_subscribe_bind(durable=consumer, stream=layout.node_stream)
    [msg] = await queue.fetch(1, timeout=5)
    assert msg.data == b"n1"
    await msg.ack_sync()
    assert (await js.consumer_info(layout.node_stream, consumer)).num_ack_pending == 0
    assert (await js.publish(layout.report_subject("n1", "vmi"), b"{}")).stream \
        == layout.reports_stream
    heartbeats = await js.key_value(layout.heartbeats_bucket)
    await heartbeats.put("n1", b"alive")
    applied = await js.key_value(layout.applied_bucket)
    await applied.put("n1.work.e1", b"done")
    assert (await applied.get("n1.work.e1")).value == b"done"
    answer = await ask(n1, layout, Query(kind="VirtualMachineInstance"), node_actor("n1"))
    assert answer.error == ""
    await js.stream_info(layout.events_stream)  # its head: where its first query must reach

    await _refused(refusals, f"$KV.{layout.heartbeats_bucket}.n2",
                   partial(heartbeats.put, "n2", b"x"))
    await _refused(refusals, f"$KV.{layout.applied_bucket}.n2.work.e1",
                   partial(applied.put, "n2.work.e1", b"x"))
    subject = layout.report_subject("n2", "vmi")
    await _refused(refusals, subject, partial(js.publish, subject, b"", timeout=SHORT))
    for name, node in (("agent-n1", "n1"), ("agent-n2", "n2"), ("agent-n1", "n2")):
        config = ConsumerConfig(name=name, durable_name=name,
                                filter_subject=layout.node_filter(node))
        subject = f"$JS.API.CONSUMER.CREATE.{layout.node_stream}.{name}.{layout.node_filter(node)}"
        await _refused(refusals, subject,
                       partial(js.add_consumer, layout.node_stream, config, timeout=SHORT))
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{layout.node_stream}.agent-n2"
    await _refused(refusals, subject, partial(n1.request, subject, b"1", timeout=SHORT))
    await _refused(refusals, f"$JS.API.DIRECT.GET.{layout.events_stream}",
                   partial(n1.jetstream(timeout=SHORT).get_msg, layout.events_stream,
                           seq=1, direct=True))
    subject = query_subject(layout, node_actor("n2"))
    await _refused(refusals, subject, partial(n1.request, subject, b"", timeout=SHORT))


async def test_a_node_publishes_its_own_consoles_and_only_the_read_service_reads_them(
        store: Store) -> None:
    """A console may show a guest's secrets: a node publishes (and reads back the end of)
    its own guests' only; people, the operator too, read none of the stream directly (the
    read service serves them as the policy says, `projections.console`)."""
    layout = store.layout
    own, other = (layout.console_subject(n, "default", "web", "u1") for n in ("n1", "n2"))
    n1, refusals = await store.connect("node-n1")
    js = n1.jetstream(timeout=2)
    assert (await js.publish(own, b"login: ")).stream == layout.console_stream
    last = await last_by_subject(n1, layout.console_stream, own)
    assert last is not None and last.data == b"login: "
    await _refused(refusals, other, partial(js.publish, other, b"", timeout=SHORT))
    subject = f"$JS.API.DIRECT.GET.{layout.console_stream}.{other}"
    await _refused(refusals, subject, partial(n1.request, subject, b"", timeout=SHORT))
    assert store.read_service is not None
    [read] = await read_all(store.read_service, layout.console_stream, own)
    assert read.data == b"login: "
    for user in ("operator", "alice"):
        nc, refused = await store.connect(user)
        subject = f"$JS.API.DIRECT.GET.{layout.console_stream}"
        await _refused(refused, subject,
                       partial(nc.jetstream(timeout=SHORT).get_msg, layout.console_stream,
                               seq=1, direct=True))


async def test_the_operator_drives_a_simulated_host(store: Store) -> None:
    """Simulation requests go from a person to a node agent within USERS."""
    layout = store.layout
    n1, _ = await store.connect("node-n1")

    async def answer(request: Msg) -> None:
        await request.respond(b"domains")

    await n1.subscribe(layout.agent_subject("n1", "sim"), cb=answer)
    await n1.flush()
    operator, _ = await store.connect("operator")
    reply = await operator.request(layout.agent_subject("n1", "sim"), b"", timeout=5)
    assert reply.data == b"domains"
    alice, refusals = await store.connect("alice")
    subject = layout.agent_subject("n1", "sim")
    await _refused(refusals, subject, partial(alice.request, subject, b"", timeout=SHORT))


async def test_no_answer_aimed_at_a_stream_lands_in_it(store: Store) -> None:
    """Issue 8, finding 1: NATS checks no reply subject, and within one account an answer
    goes wherever the requester said, so a JetStream API, Direct Get or read-service answer
    aimed at an event subject was stored as an event. Under the shipped config people and
    node agents are in USERS and every answer to them comes back there: no stream changes,
    whether the answer is aimed at the log, another person's commands, another node's
    reports or heartbeat."""
    layout = store.layout
    cp, _ = await store.connect(CONTROLPLANE_USER)
    n1, _ = await store.connect("node-n1")
    await (await n1.jetstream().key_value(layout.heartbeats_bucket)).put("n1", b"alive")
    before = await store.stored(cp)
    targets = [layout.aggregate_subject(WEB), layout.command_subject("bob", "vm", "stop"),
               layout.report_subject("n2", "vmi"), f"$KV.{layout.heartbeats_bucket}.n2"]
    query = msgspec.msgpack.encode(Query(kind="VirtualMachine"))
    asks = {
        "operator": [(query_subject(layout, "operator"), query),
                     (f"$JS.API.DIRECT.GET.{layout.events_stream}", b'{"seq": 1}')],
        "node-n1": [(query_subject(layout, node_actor("n1")), query),
                    (f"$JS.API.STREAM.INFO.{layout.events_stream}", b""),
                    (f"$JS.API.DIRECT.GET.KV_{layout.applied_bucket}.$KV."
                     f"{layout.applied_bucket}.n1.work.e1", b"")],
    }
    for user, requests in asks.items():
        nc, refusals = await store.connect(user)
        for subject, body in requests:
            for target in targets:
                await nc.publish(subject, body, reply=target)
        # One connection, in order: the last answer came back after every one aimed above.
        await nc.request(*requests[-1], timeout=5)
        # The read service takes its queries in the order sent: once it has answered this
        # one, it has taken every one above.
        await nc.request(*requests[0], timeout=5)
        assert refusals == []
    assert store.read_service is not None and store.reads is not None
    reads = store.reads

    async def answered() -> bool:  # every answer it took on, written
        return not reads.answering

    await eventually(answered, what="the read service's answers, all written")
    await store.read_service.flush()  # and sent
    assert await store.stored(cp) == before


def test_inbox_prefix_is_the_users_own() -> None:
    assert inbox_prefix("nats://node-n1:pw@h:4222,nats://node-n1:pw@g:4222") == "_INBOX.node-n1"
    assert inbox_prefix("nats://h:4222") == "_INBOX"
    assert inbox_prefix("nats://s3cr3t-token@h:4222") == "_INBOX"  # never a token in a subject


async def test_no_role_reads_another_roles_replies(secured_nats: str) -> None:
    n1, refusals = await _connect(secured_nats, "node-n1")
    await n1.subscribe("_INBOX.operator.>")
    expected = 'permissions violation for subscription to "_inbox.operator.>"'

    async def refused() -> bool:
        return any(expected in r.lower() for r in refusals)

    await eventually(refused, timeout=10, what="the server's refusal")
    await n1.close()

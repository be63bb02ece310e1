"""What each `virtbus` command does: imported only once one runs (not for `--help` or a
parse error), since it brings the client, nats and the rendering with it.

Every command that changes something prints its outcome; a refusal exits 1 with the field
and the rule. Reads render KubeVirt's JSON shape (`-o yaml|json`) or a kubectl-like table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import msgspec
import yaml
from nats.errors import NoRespondersError, NoServersError

from controlplane.context import resolve
from controlplane.defaults import TEST_DRIVER_URI
from controlplane.user.client import Client, CommandRejected
from events.api import kinds
from events.api.errors import Forbidden, InvalidSpec, NotFound
from events.api.kinds import Column, is_cluster_scoped
from events.api.manifest import parse_documents
from events.api.node import TaintKey
from events.api.replicaset import REPLICA_SET
from events.api.scheduling import TAINT_EFFECTS, Taint
from events.authorization.policy import resource_of
from events.jetstream.connect import (
    NATS_FAILURES,
    NATS_URL_ENV,
    PREFIX_ENV,
    Unreachable,
    describe,
    shown,
)
from events.jetstream.directget import read_all, sequence
from events.language.messages import SimReply, SimRequest
from events.language.subjects import DEFAULT_PREFIX, decode_token
from events.runtime.logs import configure
from projections.hco import ALERTS_QUERY, METRICS_QUERY

Handler = Callable[[argparse.Namespace, Client], Coroutine[Any, Any, int]]


def _age(created: str) -> str:
    if not created:
        return "<unknown>"
    seconds = int((datetime.now(UTC) - datetime.fromisoformat(created)).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _text(column: Column, obj: dict[str, Any]) -> str:
    """A printer column's cell as kubectl prints it: a date as an age."""
    value = column.cell(obj)
    if column.type == "date":
        return _age(value or "")
    return "" if value is None else str(value)


def printed_rows(kind: str, items: list[dict[str, Any]]) -> list[list[str]]:
    """A kind's table, header first, from its declared printer columns."""
    columns = kinds.resolve(kind).columns
    return [[c.name for c in columns]] + [[_text(c, obj) for c in columns] for obj in items]


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def dump(items: list[dict[str, Any]] | dict[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(items, indent=2)
    return yaml.safe_dump(items, sort_keys=False).rstrip()


async def cmd_apply(args: argparse.Namespace, vb: Client) -> int:
    docs: list[dict[str, Any]] = []
    for source in args.filename:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        docs += parse_documents(text, source)
    for doc in docs:
        doc.setdefault("metadata", {}).setdefault("namespace", args.namespace)
    before = {}
    for doc in docs:
        kind, meta = doc.get("kind", ""), doc.get("metadata", {})
        try:
            await vb.get(kind, scope(kind, meta.get("namespace", "")), meta.get("name", ""))
            before[id(doc)] = True
        except (NotFound, Forbidden, RuntimeError):  # the command's own outcome decides
            before[id(doc)] = False
    outcomes = await vb.apply(*docs)
    for doc, outcome in zip(docs, outcomes, strict=True):
        verb = ("configured" if outcome.sequences else "unchanged") if before[id(doc)] \
            else "created"
        group = str(doc.get("apiVersion", "")).rpartition("/")[0]
        print(f"{str(doc['kind']).lower()}.{group}/{doc['metadata']['name']} {verb}")
    return 0


def scope(kind: str, namespace: str) -> str:
    """The namespace a command looks in: none for a cluster-wide kind (nodes, HCO's)."""
    return "" if is_cluster_scoped(kind) else namespace


async def cmd_get(args: argparse.Namespace, vb: Client) -> int:
    kind = kinds.resolve(args.kind).kind
    namespace = "" if args.all_namespaces else scope(kind, args.namespace)
    if args.at is not None:
        items = await vb.query_at(args.at, kind, namespace, args.name or "")
    else:
        items = await vb.query(kind, namespace, args.name or "")
    if args.name and not items:
        where = f" at {args.at}" if args.at is not None else ""
        raise NotFound(f'{kind.lower()} "{args.name}" not found{where}')
    if args.output:
        print(dump(items[0] if args.name else {"apiVersion": "v1", "kind": "List",
                                                "items": items}, args.output))
    elif not items:
        print(f"No resources found in {namespace or 'any'} namespace.")
    else:
        print(table(printed_rows(kind, items)))
    return 0


async def cmd_act(args: argparse.Namespace, vb: Client) -> int:
    """start, stop, pause, migrate...: the verb is the command's name; the parser gives the
    message."""
    outcome = await vb.act("VirtualMachine", args.command, args.namespace, args.name)
    print(args.message.format(name=args.name, seq=",".join(map(str, outcome.sequences))))
    return 0


async def cmd_scale(args: argparse.Namespace, vb: Client) -> int:
    kind = kinds.resolve(args.kind).kind
    if kind != REPLICA_SET:
        raise InvalidSpec("kind", f"only a {REPLICA_SET} scales, not a {kind}")
    await vb.scale(args.namespace, args.name, args.replicas)
    print(f"{kind.lower()}.{resource_of(kind)[0]}/{args.name} scaled")
    return 0


async def cmd_delete(args: argparse.Namespace, vb: Client) -> int:
    kind = kinds.resolve(args.kind).kind
    extra = {} if args.grace_period is None else {"grace_period_seconds": args.grace_period}
    await vb.act(kind, "delete", scope(kind, args.namespace), args.name, **extra)
    group = resource_of(kind)[0]
    print(f'{kind.lower()}{"." if group else ""}{group} "{args.name}" deleted')
    return 0


async def cmd_watch(args: argparse.Namespace, vb: Client) -> int:
    kind = kinds.resolve(args.kind).kind
    namespace = scope(kind, args.namespace)
    async for change in vb.watch(kind, namespace, args.name or "", since=args.since):
        obj = change.object or {}
        if args.output == "json":
            line = {"sequence": change.sequence, "event": change.type,
                    "time": change.time.isoformat(), "actor": change.actor, "object": obj}
            print(json.dumps(line), flush=True)
            continue
        status = obj.get("status", {})
        state = status.get("printableStatus") or status.get("phase") or (
            "deleted" if not obj else "")
        print(f"{change.sequence:>8}  {change.time:%H:%M:%S}  {change.name:<20} "
              f"{change.type:<40} {state}", flush=True)
    return 0


async def cmd_history(args: argparse.Namespace, vb: Client) -> int:
    if args.correlation:
        entries = await vb.correlated(args.correlation)
    elif args.kind and args.name:
        entries = await vb.history(kinds.resolve(args.kind).kind, args.namespace, args.name)
    else:
        raise InvalidSpec("history", "needs KIND NAME, or --correlation ID")
    if args.output == "json":
        print(json.dumps(msgspec.to_builtins(entries), indent=2))
        return 0
    if args.correlation:
        rows = [["SEQ", "TIME", "ACTOR", "OBJECT", "EVENT"]]
        rows += [[str(e.sequence), e.time[:19], e.actor, e.object, e.type] for e in entries]
        print(table(rows))
        return 0
    rows = [["SEQ", "TIME", "ACTOR", "EVENT", "COMMAND", "CHANGED"]]
    for e in entries:
        changed = ", ".join(sorted({c["path"] for c in e.changes}))
        rows.append([str(e.sequence), e.time[:19], e.actor, e.type, e.command_id[:8],
                     changed[:80]])
    print(table(rows))
    return 0


async def cmd_patch(args: argparse.Namespace, vb: Client) -> int:
    kind = kinds.resolve(args.kind).kind
    try:
        patch = json.loads(args.patch)
    except json.JSONDecodeError as e:
        raise InvalidSpec("--patch", f"must be JSON: {e.msg}") from None
    if (args.type == "json") != isinstance(patch, list):
        raise InvalidSpec("--patch", "--type=json takes a list of operations, --type=merge "
                                     "an object")
    outcome = await vb.patch(kind, scope(kind, args.namespace), args.name, patch)
    print(f"{kind.lower()}/{args.name} {'patched' if outcome.sequences else 'unchanged'}")
    return 0


async def cmd_annotate(args: argparse.Namespace, vb: Client) -> int:
    """`key=value` sets (with --overwrite if set already to another value), `key-` removes:
    one merge patch, decided by the control plane on the object as it is then."""
    kind = kinds.resolve(args.kind).kind
    changes: dict[str, str | None] = {}
    for item in args.annotations:
        key, sep, value = item.partition("=")
        if sep:
            changes[key] = value
        elif key.endswith("-"):
            changes[key[:-1]] = None
        else:
            raise InvalidSpec(item, "must be key=value, or key- to remove")
    await vb.patch(kind, scope(kind, args.namespace), args.name,
                   {"metadata": {"annotations": changes}}, overwrite=args.overwrite)
    print(f"{kind.lower()}/{args.name} annotated")
    return 0


def _node_name(args: argparse.Namespace) -> str:
    if kinds.resolve(args.kind).kind != "Node":
        raise InvalidSpec("kind", f"{args.command} works on nodes only")
    return str(args.name)


async def cmd_label(args: argparse.Namespace, vb: Client) -> int:
    """kubectl label node N k=v k2- [--overwrite]."""
    name = _node_name(args)
    labels: dict[str, str] = {}
    remove: list[str] = []
    for item in args.labels:
        key, sep, value = item.partition("=")
        if sep:
            labels[key] = value
        elif key.endswith("-"):
            remove.append(key[:-1])
        else:
            raise InvalidSpec(item, "at least one label update is required: key=value or key-")
    outcome = await vb.label_node(name, labels, remove, overwrite=args.overwrite)
    done = "labeled" if labels else "unlabeled"
    print(f"node/{name} {done if outcome.sequences else 'not labeled'}")
    return 0


def _taint(item: str) -> tuple[Taint | None, TaintKey | None]:
    """kubectl's taint spec: `key[=value]:Effect` adds, `key[:Effect]-` removes."""
    removal = item.endswith("-")
    key_value, sep, effect = (item[:-1] if removal else item).partition(":")
    key, _, value = key_value.partition("=")
    if not key or ((sep or not removal) and effect not in TAINT_EFFECTS):
        raise InvalidSpec(item, "invalid taint spec: key[=value]:Effect with Effect one of "
                                + ", ".join(TAINT_EFFECTS) + ", or key[:Effect]- to remove")
    if removal:
        return None, msgspec.convert({"key": key, "effect": effect or None}, TaintKey)
    return msgspec.convert({"key": key, "value": value, "effect": effect}, Taint), None


async def cmd_taint(args: argparse.Namespace, vb: Client) -> int:
    """kubectl taint node N k=v:Effect k2- [--overwrite]."""
    name = _node_name(args)
    parsed = [_taint(item) for item in args.taints]
    add = [t for t, _ in parsed if t is not None]
    remove = [k for _, k in parsed if k is not None]
    await vb.taint_node(name, add, remove, overwrite=args.overwrite)
    done = ("modified" if args.overwrite else "tainted") if add else "untainted"
    print(f"node/{name} {done}")
    return 0


async def cmd_cordon(args: argparse.Namespace, vb: Client) -> int:
    """cordon and uncordon: the verb is the command's name."""
    outcome = await vb.act("Node", args.command, "", args.name)
    print(f"node/{args.name} {'' if outcome.sequences else 'already '}{args.command}ed")
    return 0


async def cmd_drain(args: argparse.Namespace, vb: Client) -> int:
    """kubectl drain: cordon and evict; then a line each time what is left changes, until
    the node holds nothing evictable (Ctrl-C stops watching, not the drain)."""
    command = vb.command("Node", "drain", "", args.name)
    await vb.run(command)
    print(f"node/{args.name} cordoned; draining (correlation id {command.id})", flush=True)
    if args.no_wait:
        return 0
    last = ""
    async for progress in vb.drain_progress(args.name):
        line = progress.describe()
        if line != last:
            print(line, flush=True)
            last = line
    print(f"node/{args.name} drained")
    return 0


async def dead_letters(vb: Client) -> list[dict[str, Any]]:
    """What the control plane could never handle, kept with the reason (oldest first)."""
    layout = vb.layout
    msgs = await read_all(vb.nc, layout.dead_letter_stream, f"{layout.prefix}.dead.>")
    return [{"sequence": sequence(m),
             "stream": decode_token((m.headers or {})["Nats-Subject"].rsplit(".", 1)[1]),
             "subject": (m.headers or {}).get("Vb-Subject", ""),
             "streamSequence": (m.headers or {}).get("Vb-Sequence", ""),
             "reason": (m.headers or {}).get("Vb-Reason", ""), "bytes": len(m.data)}
            for m in msgs]


async def cmd_dead_letters(args: argparse.Namespace, vb: Client) -> int:
    letters = await dead_letters(vb)
    if args.output == "json":
        print(json.dumps(letters, indent=2))
        return 0
    if not letters:
        print("No dead letters.")
        return 0
    rows = [["SEQ", "STREAM", "AT", "SUBJECT", "REASON"]]
    for d in letters:
        rows.append([str(d["sequence"]), str(d["stream"]), str(d["streamSequence"]),
                     str(d["subject"])[:40], str(d["reason"])[:80]])
    print(table(rows))
    return 0


async def cmd_metrics(_args: argparse.Namespace, vb: Client) -> int:
    [exposition] = await vb.query(METRICS_QUERY)
    print(exposition["text"], end="")
    return 0


async def cmd_alerts(_args: argparse.Namespace, vb: Client) -> int:
    alerts = await vb.query(ALERTS_QUERY)
    if not alerts:
        print("No alerts firing.")
        return 0
    rows = [["ALERT", "SEVERITY", "LABELS", "SINCE"]]
    for a in alerts:
        labels = ",".join(f"{k}={v}" for k, v in sorted(a["labels"].items()))
        rows.append([a["name"], a["severity"], labels, a["activeSince"]])
    print(table(rows))
    return 0


async def cmd_console(args: argparse.Namespace, vb: Client) -> int:
    """Write the VMI's serial console to stdout as the guest wrote it (bytes, not lines)."""
    out = sys.stdout.buffer
    async for output in vb.console(args.namespace, args.name, follow=args.follow):
        out.write(output)
        out.flush()
    return 0


async def cmd_sim(args: argparse.Namespace, vb: Client) -> int:
    if args.action in ("agent-stop", "agent-start"):
        node, request = args.target, SimRequest(action=args.action)
    else:
        vmi = await vb.get("VirtualMachineInstance", args.namespace, args.target)
        node = vmi.get("status", {}).get("nodeName", "")
        if not node:
            raise InvalidSpec("target", f"VMI {args.target} is not running on any node")
        request = SimRequest(action=args.action, namespace=args.namespace, name=args.target)
    reply = await vb.nc.request(vb.layout.agent_subject(node, "sim"),
                                msgspec.msgpack.encode(request), timeout=30)
    answer = msgspec.msgpack.decode(reply.data, type=SimReply)
    if not answer.ok:
        print(f"error: {answer.error}", file=sys.stderr)
        return 1
    print(f"{args.action}: done on {node}")
    return 0


HANDLERS: Final[dict[str, Handler]] = {
    "apply": cmd_apply, "delete": cmd_delete, "scale": cmd_scale, "get": cmd_get,
    "act": cmd_act, "patch": cmd_patch, "annotate": cmd_annotate, "label": cmd_label,
    "taint": cmd_taint, "cordon": cmd_cordon, "drain": cmd_drain, "metrics": cmd_metrics,
    "alerts": cmd_alerts, "dead-letters": cmd_dead_letters, "watch": cmd_watch,
    "history": cmd_history, "console": cmd_console, "sim": cmd_sim,
}
"""The parser's `run` names: each command's handler, looked up once the command runs."""


def run(args: argparse.Namespace) -> int:
    """What `virtbus` does once its arguments are parsed: `up`, or one command over the
    client; a failure is one line on stderr and a non-zero exit."""
    configure(level="warning" if args.command not in ("up",) else None)
    if args.command == "up":
        return _up(args)
    ctx = resolve(args.nats_url, args.prefix, credentials=args.credentials, ca=args.ca,
                  cert=args.cert, key=args.key)

    async def go() -> int:
        vb = await Client.connect(ctx.access, ctx.prefix, args.actor)
        try:
            return await HANDLERS[args.run](args, vb)
        finally:
            await vb.close()

    try:
        return asyncio.run(go())
    except InvalidSpec as e:
        print(f"error: {e.field}: {e.rule}", file=sys.stderr)
    except CommandRejected as e:
        print(f"error: {e}", file=sys.stderr)
    except (NotFound, Forbidden) as e:
        print(f"error: {e}", file=sys.stderr)
    except Unreachable as e:  # before OSError, its base
        print(f"error: {e}", file=sys.stderr)
    except NoRespondersError:
        print("error: the read service is not answering; is `virtbus up` running?",
              file=sys.stderr)
    except (OSError, TimeoutError, NoServersError) as e:
        print(f"error: cannot reach virtbus at {shown(ctx.nats_url)}: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    return 1


def _up(args: argparse.Namespace) -> int:
    """`virtbus up`: the one command that runs the control plane, so it alone imports it."""
    from controlplane.up import UpOptions, up  # noqa: PLC0415 (only `up` needs it)

    opts = UpOptions(data_dir=args.data_dir.resolve(), nodes=args.nodes,
                     nats_port=args.nats_port,
                     nats_url=args.nats_url or os.environ.get(NATS_URL_ENV, ""),
                     prefix=args.prefix or os.environ.get(PREFIX_ENV) or DEFAULT_PREFIX,
                     libvirt_uri=args.libvirt_uri,
                     replicas=args.replicas, http_port=args.http_port,
                     secure=args.secure or args.policy is not None, policy=args.policy,
                     fleet=args.fleet, node_cpus=args.node_cpu,
                     node_memory=int(args.node_memory),
                     **({"node_grace_seconds": args.node_grace} if args.node_grace else {}))
    sized = opts.fleet or opts.node_cpus or opts.node_memory
    if opts.node_cpus < 0 or opts.node_memory < 0:
        print("error: --node-cpu and --node-memory must not be negative", file=sys.stderr)
        return 2
    if sized and not opts.uses_fleet:
        print("error: --fleet, --node-cpu and --node-memory simulate nodes in one process: "
              f"{TEST_DRIVER_URI} only, and not with --secure (a fleet has one NATS "
              "identity)", file=sys.stderr)
        return 2
    if opts.secure and opts.nats_url:
        print("error: --secure runs its own nats-server; for a server of your own, give "
              "it `python -m events.authorization`'s accounts and TLS", file=sys.stderr)
        return 2
    try:
        return up(opts)
    except Unreachable as e:
        print(f"error: {e}", file=sys.stderr)
    except NATS_FAILURES as e:  # reached, but its set-up failed (no JetStream, say)
        where = shown(opts.nats_url) if opts.nats_url else "the embedded nats-server"
        print(f"error: NATS at {where}: {describe(e)}", file=sys.stderr)
    return 1

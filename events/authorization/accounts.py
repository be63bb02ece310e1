"""The NATS side of authorization: one NATS user per role, per person and per node, each
allowed exactly what the design's NATS layout gives it, rendered as nats-server config.

Two accounts. STORE (`<P>`) holds every stream and bucket; only the stream administrator,
the control plane and the read service log in there. People and node agents log in to
USERS (`<P>_USERS`) and reach STORE through service imports (what they publish) and stream
imports (what STORE delivers to them). Within one account a requester names any reply
subject and the server answers there in that account (NATS checks no reply subject), so a
JetStream API or Direct Get answer aimed at `<p>.ev.…` would be stored as an event. Across an
import, the reply is mapped to a `_R_.` subject in STORE and the answer is delivered back in
USERS, where no stream is; and every service import is a wildcard (`_wildcard` says why), so
an answer aimed at an imported subject does not cross either. Nothing a person or a node
does lands in a stream but what it publishes through an import its permissions allow.

The server vouches for identity this way: a person may publish commands only under
`<p>.cmd.<their name>.>` and a node agent reports only under `<p>.report.<node>.>`, so the
control plane can take the actor and the node from the subject. What each person may do
beyond that (which verbs, in which namespaces) is the policy's
(`events.authorization.policy`), decided by
the control plane and the read service, since NATS cannot see a command's namespace.

`deploy/nats/accounts.conf` is this module's output for `deploy/nats/policy.yaml` and three
nodes (`python -m events.authorization`); a test keeps them equal. Passwords are never in
the output: each is `$VIRTBUS_NATS_<USER>_PASSWORD`, read from the server's environment.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Final, Literal

import msgspec

from events.api.errors import InvalidSpec
from events.api.names import DNS1123_LABEL, SYSTEM_ACTOR_PREFIX
from events.authorization.policy import KUBEVIRT_GROUP, Policy, Request, load_policy
from events.jetstream.connect import inbox_for
from events.jetstream.streams import reads_direct, work_consumer
from events.language.messages import node_actor
from events.language.query import query_subject
from events.language.subjects import Layout, encode_token

ADMIN_USER: Final = "admin"
"""Stream administration: what `virtbus up` and deploy jobs use to create and update
streams and buckets. No running process holds it."""
CONTROLPLANE_USER: Final = "controlplane"
PROJECTIONS_USER: Final = "projections"
NODE_USER_PREFIX: Final = "node-"
ROLE_USERS: Final = (ADMIN_USER, CONTROLPLANE_USER, PROJECTIONS_USER)
OPERATING: Final = Request("get", "virtbus.io", "deadletters")
"""Reading dead letters (`virtbus dead-letters`, messages of every user) and simulating a
test host's events (`virtbus sim`): only a wildcard rule (`cluster-admin`) grants it."""


USERS_SUFFIX: Final = "_USERS"
"""The USERS account is the STORE account's name with this suffix."""
STREAMED_ANSWERS: Final = ("$JS.API.DIRECT.GET.", "$JS.API.CONSUMER.MSG.NEXT.")
"""Requests answered by more than one message (a Direct Get batch, a pull): exported with
`response_type: stream`, so the mapped reply lives past the first answer."""

Home = Literal["store", "users"]


class NatsUser(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    about: str
    publish: list[str]
    """For a user at home in USERS: what it reaches in STORE (imported), and `peers`."""
    deny: list[str] = []
    subscribe: list[str] = []
    home: Home = "store"
    peers: list[str] = []
    """What it publishes to other users of USERS (simulation requests and their answers):
    allowed, never imported from STORE."""
    deliveries: list[str] = []
    """What STORE publishes to it (its outcomes): exported from STORE to USERS as streams.
    Not its inbox: the answers to its requests cross back by the import they went by, and
    nothing else in STORE has anything to deliver there."""

    def imports(self) -> list[str]:
        """The STORE subjects it publishes to (service imports): every allowed one but its
        peers'."""
        return [s for s in self.publish if s not in self.peers] if self.home == "users" else []


def password_env(user: str) -> str:
    """The server's environment variable holding `user`'s password."""
    return "VIRTBUS_NATS_" + re.sub(r"[^A-Z0-9]", "_", user.upper()) + "_PASSWORD"


def node_user(node: str) -> str:
    return NODE_USER_PREFIX + encode_token(node)


class _Api:
    """JetStream API subjects of one layout."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def kv(self, bucket: str) -> str:
        return f"KV_{bucket}"

    def stream_info(self, *streams: str) -> list[str]:
        return [f"$JS.API.STREAM.INFO.{s}" for s in streams]

    def reads(self, stream: str) -> list[str]:
        """Direct get (single, last-by-subject, batched) and stored-message get."""
        return [f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>",
                f"$JS.API.STREAM.MSG.GET.{stream}"]

    def snapshot_reads(self) -> list[str]:
        """Reading the read-model snapshots (object store): the meta and chunks by an
        ordered consumer, the meta of one object by last-by-subject."""
        stream = self.layout.read_snapshots_stream
        return [*self.stream_info(stream), *self.reads(stream),
                *self.consumers(stream, durable=False, acks=False)]

    def kv_reads(self, bucket: str, keys: str = ">") -> list[str]:
        """Reads of `keys`: Direct Get, whose subject names the key, on a bucket read so
        (`events.jetstream.streams.reads_direct`); else the stored-message get, which reads any key
        (only roles that may read every key get it)."""
        if reads_direct(self.layout, bucket):
            return [f"$JS.API.DIRECT.GET.{self.kv(bucket)}.$KV.{bucket}.{keys}"]
        return [f"$JS.API.STREAM.MSG.GET.{self.kv(bucket)}"]

    def consumers(self, stream: str, *, durable: bool = True, acks: bool = True) -> list[str]:
        """Create (plain, named, named+filter, legacy durable), info, delete, pull, acks and
        flow control of consumers on `stream`."""
        out = [f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}.>",
               f"$JS.API.CONSUMER.INFO.{stream}.*", f"$JS.API.CONSUMER.DELETE.{stream}.*",
               f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*", f"$JS.FC.{stream}.>"]
        if durable:
            out.insert(2, f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.*")
        if acks:
            out.append(f"$JS.ACK.{stream}.>")
        return out

    def streams(self) -> list[str]:
        layout = self.layout
        return [layout.events_stream, layout.snapshots_stream, layout.commands_stream,
                layout.node_stream, layout.reports_stream, layout.dead_letter_stream,
                layout.read_snapshots_stream, layout.console_stream,
                *(self.kv(b) for b in self.buckets())]

    def buckets(self) -> list[str]:
        layout = self.layout
        return [layout.heartbeats_bucket, layout.leases_bucket, layout.checkpoints_bucket,
                layout.outcomes_bucket, layout.applied_bucket]


_COMMON: Final = ["$JS.API.INFO", "$JS.API.STREAM.NAMES"]
"""Account info, and stream lookup by subject (nats-py does it before subscribing): they
reveal only names and usage."""
_NO_LOG_SURGERY: Final = ["$JS.API.STREAM.DELETE.>", "$JS.API.STREAM.PURGE.>",
                          "$JS.API.STREAM.MSG.DELETE.>", "$JS.API.STREAM.RESTORE.>"]
"""Nobody deletes or purges a stream or a message: the log is kept forever."""


def admin(layout: Layout) -> NatsUser:
    api = _Api(layout)
    streams = api.streams()
    return NatsUser(
        name=ADMIN_USER,
        about="Creates and updates every stream and bucket (`virtbus up`, deploy jobs); "
              "never deletes, purges or shrinks what is kept forever.",
        publish=[*_COMMON, "$JS.API.STREAM.LIST",
                 *(f"$JS.API.STREAM.{op}.{s}" for s in streams
                   for op in ("CREATE", "UPDATE", "INFO"))],
        deny=[f"{layout.prefix}.>", "$KV.>", *_NO_LOG_SURGERY],
        subscribe=[inbox(ADMIN_USER)])


def controlplane(layout: Layout) -> NatsUser:
    api, p = _Api(layout), layout.prefix
    events, commands = layout.events_stream, layout.commands_stream
    reports, node = layout.reports_stream, layout.node_stream
    buckets = api.buckets()
    own = [layout.outcomes_bucket, layout.leases_bucket, layout.checkpoints_bucket]
    return NatsUser(
        name=CONTROLPLANE_USER,
        about="The only writer of events (expected last subject sequence, atomic batches, "
              "read guards); dispatches node work and makes each node's work consumer; "
              "consumes commands and reports; owns the outcomes, leases and checkpoints "
              "buckets; reads heartbeats. Stream "
              "administration is the admin user's: it only looks streams up.",
        publish=[f"{layout.events_root}.>", f"{layout.tracking_root}.>",
                 f"{layout.snapshots_root}.>", f"{p}.node.>", layout.guard_subject,
                 f"{p}.dead.>", *(f"$KV.{b}.>" for b in own),
                 *_COMMON, "$JS.API.STREAM.LIST",
                 *api.stream_info(*api.streams()),
                 *api.reads(events), *api.reads(layout.snapshots_stream), *api.reads(commands),
                 *api.snapshot_reads(),
                 *(r for b in buckets[:4] for r in api.kv_reads(b)),
                 *api.consumers(events), *api.consumers(commands), *api.consumers(reports),
                 f"$JS.API.CONSUMER.NAMES.{node}", f"$JS.API.CONSUMER.INFO.{node}.*",
                 f"$JS.API.CONSUMER.CREATE.{node}.>", f"$JS.API.CONSUMER.DELETE.{node}.*",
                 *(c for b in buckets[:4]
                   for c in api.consumers(api.kv(b), durable=False, acks=False))],
        deny=[f"{p}.cmd.>", f"{p}.report.>", f"$KV.{layout.heartbeats_bucket}.>",
              "$JS.API.STREAM.CREATE.>", "$JS.API.STREAM.UPDATE.>", *_NO_LOG_SURGERY],
        subscribe=[inbox(CONTROLPLANE_USER)])


def projections(layout: Layout) -> NatsUser:
    api, events = _Api(layout), layout.events_stream
    return NatsUser(
        name=PROJECTIONS_USER,
        about="Folds the event log into read models (and writes their snapshots), keeps its "
              "positions in the checkpoints "
              "bucket, reads the serial consoles for those the policy lets see them, and "
              "answers queries: on the control plane's inboxes, and on the "
              "`_R_.` replies the server maps a USERS requester's reply to. No "
              "`allow_responses`, which would let a requester aim an answer at any subject "
              "(an event subject among them).",
        publish=[f"$KV.{layout.checkpoints_bucket}.>", inbox(CONTROLPLANE_USER), "_R_.>",
                 *_COMMON,
                 f"$O.{layout.read_snapshots_bucket}.>", *api.snapshot_reads(),
                 *api.stream_info(events, layout.reports_stream,
                                  api.kv(layout.checkpoints_bucket)),
                 *api.reads(events), *api.kv_reads(layout.checkpoints_bucket),
                 *api.consumers(events), *api.reads(layout.console_stream)],
        deny=[f"{layout.prefix}.>", f"$KV.{layout.outcomes_bucket}.>",
              f"$KV.{layout.leases_bucket}.>", f"$KV.{layout.heartbeats_bucket}.>",
              *_NO_LOG_SURGERY],
        subscribe=[inbox(PROJECTIONS_USER), f"{layout.query_root}.>"])


def person(layout: Layout, user: str, *, reads_all_events: bool, operates: bool) -> NatsUser:
    """A person (or a tool): commands and queries under its own name, its own outcomes;
    the event log itself, by Direct Get, only when the policy lets it change every VM (anyone
    else asks the read service, which filters by namespace and redacts cloud-init secrets).

    No person creates a consumer: a consumer lives in STORE and its deliveries are published
    there, on whatever `deliver_subject` its creator chose, which no permission can see (it is
    in the request's body). A cluster-admin's consumer delivered copies of the log onto
    another person's outcome key, stored in the outcomes bucket. NATS operators share a
    stream across accounts by the owner's consumers or by request/reply (Direct Get), whose
    answers cross back to the asker's account; people get Direct Get only."""
    api, p, token = _Api(layout), layout.prefix, encode_token(user)
    outcomes = layout.outcomes_bucket
    # No STREAM.INFO: its body (`subjects_filter`), which no permission sees, would list
    # every subject of the stream: every object's name, every user's outcome keys.
    publish = [f"{p}.cmd.{token}.>", f"{layout.query_root}.{token}.>", *_COMMON,
               *api.kv_reads(outcomes, f"{token}.>")]
    if reads_all_events:
        publish += api.reads(layout.events_stream)
    peers = [f"{p}.agent.*.>"] if operates else []
    if operates:  # dead letters hold every user's messages; simulations are test-only
        publish += [*api.reads(layout.dead_letter_stream), *peers]
    deliveries = [f"$KV.{outcomes}.{token}.>"]
    return NatsUser(
        name=user, about=f"The person or tool {user!r}.", publish=publish,
        deny=[f"{layout.events_root}.>", f"{layout.tracking_root}.>",
              f"{layout.snapshots_root}.>", f"{p}.node.>", f"{p}.report.>", "$KV.>",
              "$JS.API.CONSUMER.>", "$JS.API.STREAM.CREATE.>", "$JS.API.STREAM.UPDATE.>",
              *_NO_LOG_SURGERY],
        subscribe=[inbox(user), *deliveries], home="users", peers=peers,
        deliveries=deliveries)


def inbox(user: str) -> str:
    """`user`'s inbox subtree (`events.jetstream.connect.inbox_for`): its replies arrive there,
    and only it subscribes to it."""
    return f"{inbox_for(user)}.>"


def node_agent(layout: Layout, node: str, askers: Iterable[str] = ()) -> NatsUser:
    """A node agent; it answers simulation requests (test driver only) from `askers` (the
    people who may operate), and so publishes to their inboxes and to no other: not to
    another node's, nor to a person's who never asks it."""
    api, p, token = _Api(layout), layout.prefix, encode_token(node)
    answers = [inbox(asker) for asker in askers]
    user, consumer = node_user(node), work_consumer(node)
    heartbeats, applied = layout.heartbeats_bucket, layout.applied_bucket
    return NatsUser(
        name=user,
        about=f"The node agent of {node!r}: its own node work (it binds to and pulls from "
              "the consumer the control plane makes; it creates and updates no consumer, "
              "since a create request's body, which no permission sees, could make it push "
              "the node's work anywhere), reports, heartbeat and work log; asks the read "
              "service which VMIs are its own. It reads no events. It publishes its guests' "
              "serial consoles and reads back only the last of each.",
        publish=[f"{p}.report.{token}.>", layout.console_filter(node),
                 f"$JS.API.DIRECT.GET.{layout.console_stream}.{layout.console_filter(node)}",
                 f"$KV.{heartbeats}.{token}",
                 f"$KV.{applied}.{token}.>", query_subject(layout, node_actor(node)),
                 *_COMMON,
                 *api.stream_info(layout.events_stream, layout.node_stream,
                                  layout.reports_stream, api.kv(heartbeats), api.kv(applied)),
                 f"$JS.API.DIRECT.GET.{api.kv(heartbeats)}.$KV.{heartbeats}.{token}",
                 *api.kv_reads(applied, f"{token}.>"),
                 f"$JS.API.CONSUMER.INFO.{layout.node_stream}.{consumer}",
                 f"$JS.API.CONSUMER.MSG.NEXT.{layout.node_stream}.{consumer}",
                 f"$JS.ACK.{layout.node_stream}.{consumer}.>", *answers],
        deny=[f"{layout.events_root}.>", f"{layout.tracking_root}.>", f"{p}.cmd.>",
              f"{p}.node.>", "$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>",
              *_NO_LOG_SURGERY],
        subscribe=[inbox(user), layout.agent_subject(node, ">")],
        home="users", peers=answers)


def users_for(layout: Layout, policy: Policy, nodes: Iterable[str]) -> list[NatsUser]:
    """Every NATS user of an installation: the roles, each person the policy binds, each node."""
    people, operators = [], []
    # Kubernetes' own users (`system:anonymous`, bound for the HTTP API) log in to no NATS.
    for user in (u for u in policy.users if not u.startswith(SYSTEM_ACTOR_PREFIX)):
        if not DNS1123_LABEL.fullmatch(user) or user in ROLE_USERS \
                or user.startswith(NODE_USER_PREFIX):
            raise InvalidSpec(f"subjects[{user!r}]", "a user name must be a DNS-1123 label "
                              f"other than {', '.join(ROLE_USERS)} and not start with "
                              f"{NODE_USER_PREFIX!r}")
        # The log holds cloud-init secrets in clear: only who may change every VM (and so
        # could read them back by writing them) reads it directly; others ask the read
        # service, which filters and redacts.
        everywhere = policy.namespaces(user, "patch", KUBEVIRT_GROUP, "virtualmachines") is None
        operates = policy.allows(user, OPERATING)
        people.append(person(layout, user, reads_all_events=everywhere, operates=operates))
        operators += [user] if operates else []
    return [admin(layout), controlplane(layout), projections(layout), *people,
            *(node_agent(layout, n, operators) for n in nodes)]


def users_account(account: str) -> str:
    """The USERS account beside the STORE account `account`."""
    return account + USERS_SUFFIX


def render(users: Iterable[NatsUser], *, account: str, header: str = "",
           passwords: Mapping[str, str] | None = None) -> str:
    """nats-server config: STORE (`account`: the streams, and the users at home there),
    USERS (`account` + `_USERS`: people and node agents, with what they reach of STORE
    imported), and the system account. Each password is a reference to the server's
    environment, or, given `passwords` (a config file that is itself a secret, mode 0600),
    the password itself."""

    def password(user: str) -> str:
        return _quote(passwords[user]) if passwords else f"${password_env(user)}"

    users = list(users)
    outside = [u for u in users if u.home == "users"]
    services = _outermost(_wildcard(s) for u in outside for s in u.imports())
    streams = _outermost(s for u in outside for s in u.deliveries)
    users_name = users_account(account)
    to_users = f"accounts: [{_quote(users_name)}]"
    exports = [*(f"{{ service: {_quote(s)}, {to_users}{_response_type(s)} }}" for s in services),
               *(f"{{ stream: {_quote(s)}, {to_users} }}" for s in streams)]
    imports = [*(f"{{ service: {{ account: {_quote(account)}, subject: {_quote(s)} }} }}"
                 for s in services),
               *(f"{{ stream: {{ account: {_quote(account)}, subject: {_quote(s)} }} }}"
                 for s in streams)]
    out = [header] if header else []
    out += ["accounts {", "",
            "  # STORE: every stream and bucket, and the roles that keep them.",
            *_account(account, [u for u in users if u.home == "store"], password=password,
                      settings=["jetstream: enabled"], links_key="exports", links=exports),
            "", "  # USERS: people and node agents. No stream is here: an answer aimed at any "
            "subject", "  # of this account lands in no log.",
            *_account(users_name, outside, password=password, settings=[],
                      links_key="imports", links=imports),
            "", "  # The server's own account: monitoring and JetStream cluster administration.",
            "  SYS {", f"    users: [ {{ user: sys, password: {password('sys')} }} ]", "  }",
            "}", "", "system_account: SYS", ""]
    return "\n".join(out)


def _account(name: str, users: list[NatsUser], *, password: Callable[[str], str],
             settings: list[str], links_key: str, links: list[str]) -> list[str]:
    """One account's block: its users, then its exports or imports (`links_key`)."""
    out = [f"  {name} {{", *(f"    {line}" for line in settings), "", "    users: ["]
    for user in users:
        out += ["", *(f"      # {line}" for line in _wrap(user.about)),
                "      {", f"        user: {_quote(user.name)}",
                f"        password: {password(user.name)}",
                "        permissions: {", "          publish: {",
                *_list("allow", user.publish), *_list("deny", user.deny), "          }",
                "          subscribe: {", *_list("allow", user.subscribe), "          }",
                "        }", "      }"]
    out += ["    ]", "", f"    {links_key}: [", *(f"      {link}" for link in links), "    ]",
            "  }"]
    return out


def _response_type(subject: str) -> str:
    return ", response_type: stream" if subject.startswith(STREAMED_ANSWERS) else ""


def _wildcard(subject: str) -> str:
    """The service import carrying `subject`: a wildcard one, its last token `*` if it has
    none. An answer aimed at a literal import subject in USERS is carried into STORE under
    that subject, past every permission (so `node-n1`'s answer aimed at `$KV.<P>_HEARTBEATS.n2`
    was stored as n2's heartbeat); one matching a wildcard import goes on under the mapped
    reply it came by, and reaches nothing. Each user's permissions still name its own."""
    if "*" in subject.split(".") or subject.endswith(".>"):
        return subject
    return subject.rpartition(".")[0] + ".*"


def _outermost(subjects: Iterable[str]) -> list[str]:
    """Each subject once, and none that another one covers: two imports matching one
    subject would carry a request into STORE twice."""
    unique = list(dict.fromkeys(subjects))
    return [s for s in unique if not any(o != s and _covers(o, s) for o in unique)]


def _covers(pattern: str, subject: str) -> bool:
    """Whether `pattern` matches every subject `subject` (itself maybe a wildcard) does."""
    tokens = subject.split(".")
    for i, token in enumerate(pattern.split(".")):
        if token == ">":
            return len(tokens) > i
        if i >= len(tokens) or tokens[i] == ">" or token not in ("*", tokens[i]):
            return False
    return len(pattern.split(".")) == len(tokens)


def _list(key: str, subjects: list[str]) -> list[str]:
    if not subjects:
        return []
    return [f"            {key}: [", *(f"              {_quote(s)}" for s in subjects),
            "            ]"]


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _wrap(text: str, width: int = 86) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return [*lines, line] if line else lines


HEADER: Final = """\
# virtbus — NATS accounts, users and permissions. GENERATED: do not edit by hand.
#
#   python -m events.authorization --policy deploy/nats/policy.yaml \\
#       --node n1 --node n2 --node n3 > deploy/nats/accounts.conf
#
# Two accounts. VIRTBUS holds every stream and bucket; only the roles that keep them log in
# there: admin (stream create/update), controlplane, projections. People (one user per
# person the policy binds) and node agents (`node-<node>`) log in to VIRTBUS_USERS, which
# has no JetStream of its own: it reaches VIRTBUS only through the service imports below
# (what they may publish: commands, queries, reports, JetStream API calls, acks) and stream
# imports (what VIRTBUS delivers to them: their outcomes). A reply subject crossing an
# import is mapped by the server, and its answer is delivered back in VIRTBUS_USERS, so no
# answer a person or a node aims anywhere can be stored in a stream. Each user's
# permissions still say which of the imported subjects it may use (its own commands, its
# own reports, ...). No person or node agent creates or updates a JetStream consumer (its
# deliveries would go where its creator said, in VIRTBUS): people read the log by Direct Get
# or ask the read service; the control plane makes each node's pull consumer, and its agent
# only binds to it and pulls.
#
# Include it from a server config (`include ./accounts.conf` in single.conf,
# `include ../accounts.conf` in cluster/nN.conf). Passwords are never in this file: each is
# read from the server's environment (VIRTBUS_NATS_<USER>_PASSWORD), and a server started
# without one refuses to start. Allow lists are exhaustive; deny lists restate the most
# important refusals. Replies arrive on each user's own inbox subtree, `_INBOX.<user>.>`,
# so no user reads another's replies; nobody publishes into another's inbox but the read
# service (into the control plane's) and node agents (answering the operators' simulation
# requests, into those operators' inboxes only).
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m events.authorization",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, required=True, help="RBAC policy (YAML)")
    parser.add_argument("--node", action="append", default=[], help="a node agent's node")
    parser.add_argument("--prefix", default=Layout().prefix)
    args = parser.parse_args(argv)
    layout = Layout(args.prefix)
    try:
        users = users_for(layout, load_policy(args.policy), args.node)
    except (OSError, InvalidSpec) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(render(users, account=layout.upper, header=HEADER))
    return 0


if __name__ == "__main__":
    sys.exit(main())

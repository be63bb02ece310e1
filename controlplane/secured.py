"""`virtbus up --secure`: everything a secured single-machine installation needs, made once in
`<data dir>/secure/` and kept (0600/0700): a CA and the server's TLS certificate, one NATS
identity (a random password in a credentials file) per role, per node agent and per person
the policy binds, a bearer token per person for the HTTP read API, the policy itself, and
the nats-server authorization it all renders to.

Each process gets only its own credentials file and the CA (paths, never secrets, on its
command line); the person who ran `up` gets the operator's, through the context file.
"""

from __future__ import annotations

import csv
import io
import os
import secrets
from pathlib import Path
from typing import Final

import msgspec

from events.authorization.accounts import (
    ADMIN_USER,
    CONTROLPLANE_USER,
    PROJECTIONS_USER,
    NatsUser,
    node_user,
    render,
    users_for,
)
from events.authorization.policy import Policy, load_policy
from events.jetstream.connect import Credentials
from events.jetstream.server import ServerTLS
from events.jetstream.tls import CertFiles, load_ca, make_ca, make_server_cert
from events.language.subjects import Layout

SECURE_DIR: Final = "secure"
OPERATOR_USER: Final = "operator"
"""The person running `up`: bound to `cluster-admin` by the default policy."""
DEFAULT_POLICY: Final = f"""\
# Made by `virtbus up --secure`: the operator may do everything. Add RoleBindings for
# others (Kubernetes RBAC objects, see deploy/nats/policy.yaml) and run `up --secure` again.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: operator-cluster-admin
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: cluster-admin
subjects:
  - kind: User
    name: {OPERATOR_USER}
"""
PASSWORD_BYTES: Final = 24
HTTP_TOKENS: Final = "http-tokens.csv"
"""The HTTP read API's token file (kube-apiserver's `--token-auth-file` format)."""


class Secured(msgspec.Struct, frozen=True, kw_only=True):
    """Where a secured installation's material is, and the server's side of it."""

    directory: str
    ca: str
    server: ServerTLS
    policy: str
    server_config: str
    """The authorization block (passwords inside): the server's config, written 0600."""
    http_tokens: str

    def credentials(self, user: str) -> str:
        return str(Path(self.directory) / "credentials" / f"{user}.json")

    def node_credentials(self, node: str) -> str:
        return self.credentials(node_user(node))

    @property
    def admin(self) -> str:
        return self.credentials(ADMIN_USER)

    @property
    def controlplane(self) -> str:
        return self.credentials(CONTROLPLANE_USER)

    @property
    def projections(self) -> str:
        return self.credentials(PROJECTIONS_USER)

    @property
    def operator(self) -> str:
        return self.credentials(OPERATOR_USER)


def secure(data_dir: Path, layout: Layout, nodes: list[str], policy: Path | None) -> Secured:
    """Make (or keep) the material under `data_dir/secure`; a policy given replaces the kept
    one. Passwords already made are kept, so restarting `up` changes no identity."""
    directory = data_dir / SECURE_DIR
    _private_dir(directory)
    policy_path = directory / "policy.yaml"
    if policy is not None:
        _write_private(policy_path, policy.read_text())
    elif not policy_path.exists():
        _write_private(policy_path, DEFAULT_POLICY)
    ca = load_ca(directory / "ca") or make_ca(directory / "ca")
    server = _server_cert(ca, directory / "server")
    rules = load_policy(policy_path)
    users = users_for(layout, rules, nodes)
    passwords = {user.name: _password(directory, user) for user in users}
    passwords["sys"] = secrets.token_urlsafe(PASSWORD_BYTES)  # nobody logs in as sys here
    return Secured(directory=str(directory), ca=ca.cert,
                   server=ServerTLS(cert=server.cert, key=server.key, ca=ca.cert),
                   policy=str(policy_path),
                   server_config=render(users, account=layout.upper, passwords=passwords),
                   http_tokens=str(_http_tokens(directory / HTTP_TOKENS, rules)))


def _http_tokens(path: Path, policy: Policy) -> Path:
    """A bearer token per person the policy binds (`token,user,uid`), those already made
    kept, so restarting `up` changes no token."""
    tokens = {row[1]: row[0] for row in csv.reader(path.read_text().splitlines())
              if len(row) >= 2} if path.exists() else {}
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for user in policy.users:
        writer.writerow([tokens.get(user) or secrets.token_urlsafe(PASSWORD_BYTES), user, user])
    _write_private(path, out.getvalue())
    return path


def _server_cert(ca: CertFiles, directory: Path) -> CertFiles:
    cert, key = directory / "server.crt", directory / "server.key"
    if cert.exists() and key.exists():
        return CertFiles(cert=str(cert), key=str(key), ca=ca.cert)
    return make_server_cert(ca, directory, ["localhost"], ["127.0.0.1"])


def _password(directory: Path, user: NatsUser) -> str:
    """The user's password, made and written to its credentials file the first time."""
    path = directory / "credentials" / f"{user.name}.json"
    if path.exists():
        return msgspec.json.decode(path.read_bytes(), type=Credentials).password
    _private_dir(path.parent)
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    _write_private(path, msgspec.json.encode(Credentials(user=user.name,
                                                         password=password)).decode())
    return password


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)

"""TLS and credentials against a real nats-server with certificates made by
events.jetstream.tls: the
right CA connects, anything else is refused in one line; mutual TLS wants a client
certificate; a credentials file others may read is refused; no password ever reaches a log
line or an error; and every shipped NATS config, with its TLS blocks, passes the server's
own config check once its certificate files exist."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from events.jetstream.connect import (
    NO_CLIENT_CERT,
    NO_TLS,
    Access,
    AccessRefused,
    Unreachable,
    connect,
    read_credentials,
)
from events.jetstream.server import EmbeddedNats, ServerTLS, free_port, nats_server_binary
from events.jetstream.tls import (
    CertFiles,
    load_ca,
    main,
    make_ca,
    make_client_cert,
    make_server_cert,
)
from tests.system.harness import eventually
from tests.test_unreachable_nats import SAFETY_NET_SECONDS, _env, _running

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
USER = "controlplane"
PASSWORD = "s3cret-Passw0rd"
_ENV_REF = re.compile(r'^[^"#\n]*?\$([A-Za-z_][A-Za-z0-9_]*)', re.MULTILINE)


class PKI:
    """A CA, a server certificate for 127.0.0.1 / localhost, a client certificate, and a
    second CA that signed nothing of this server's."""

    def __init__(self, root: Path) -> None:
        self.ca = make_ca(root / "ca")
        self.server = make_server_cert(self.ca, root / "ca", ["localhost"], ["127.0.0.1"])
        self.client = make_client_cert(self.ca, root / "ca", USER)
        self.other_ca = make_ca(root / "other")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI(tmp_path_factory.mktemp("pki"))


def _server_tls(pki: PKI, *, verify: bool = False) -> ServerTLS:
    return ServerTLS(cert=pki.server.cert, key=pki.server.key, ca=pki.ca.cert, verify=verify)


_AUTH = f'authorization {{ user: {USER}, password: "{PASSWORD}" }}\n'


def _credentials(path: Path, password: str = PASSWORD, mode: int = 0o600) -> str:
    path.write_text(json.dumps({"user": USER, "password": password}))
    path.chmod(mode)
    return str(path)


async def _round_trip(access: Access) -> None:
    nc = await connect(access, "tls-test", allow_reconnect=False)
    try:
        sub = await nc.subscribe("probe")
        await nc.publish("probe", b"hello")
        assert (await sub.next_msg(timeout=SAFETY_NET_SECONDS)).data == b"hello"
    finally:
        await nc.close()


async def _refused(access: Access) -> str:
    """The one line a refused connection raises (never a traceback or a password)."""
    with pytest.raises(Unreachable) as caught:
        await connect(access, "tls-test", allow_reconnect=False)
    line = str(caught.value)
    assert "\n" not in line and PASSWORD not in line, line
    return caught.value.reason


# -- the certificates themselves ----------------------------------------------------------


def test_keys_are_private_and_certificates_chain(pki: PKI) -> None:
    for files in (pki.ca, pki.server, pki.client):
        assert os.stat(files.key).st_mode & 0o777 == 0o600, files.key
        assert files.ca == pki.ca.cert
    context = ssl.create_default_context(cafile=pki.ca.cert)
    context.load_cert_chain(pki.client.cert, pki.client.key)  # key matches its cert


def test_the_cli_keeps_an_existing_ca(tmp_path: Path) -> None:
    assert main([str(tmp_path), "--host", "localhost", "--client", "client"]) == 0
    first = Path(tmp_path / "ca.crt").read_bytes()
    assert main([str(tmp_path), "--ip", "127.0.0.1"]) == 0
    assert Path(tmp_path / "ca.crt").read_bytes() == first
    assert load_ca(tmp_path) == CertFiles(cert=str(tmp_path / "ca.crt"),
                                          key=str(tmp_path / "ca.key"),
                                          ca=str(tmp_path / "ca.crt"))
    assert {p.name for p in tmp_path.iterdir()} == {
        "ca.crt", "ca.key", "server.crt", "server.key", "client.crt", "client.key"}


def test_make_certs_script(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    result = subprocess.run([str(DEPLOY / "tls" / "make-certs"), str(out), "--node", "n1"],
                            capture_output=True, text=True, check=False,
                            timeout=SAFETY_NET_SECONDS, env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    names = {p.name for p in out.iterdir()}
    for role in ("ca", "server", "controlplane", "projections", "client", "node-n1"):
        assert {f"{role}.crt", f"{role}.key"} <= names, names
        assert os.stat(out / f"{role}.key").st_mode & 0o777 == 0o600


# -- a server with TLS --------------------------------------------------------------------


@pytest.fixture
def tls_nats(tmp_path: Path, pki: PKI) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path / "nats", tls=_server_tls(pki), extra_config=_AUTH) as server:
        yield server


async def test_a_client_with_the_ca_connects(tls_nats: EmbeddedNats, pki: PKI,
                                             tmp_path: Path) -> None:
    creds = _credentials(tmp_path / "creds.json")
    await _round_trip(Access(tls_nats.url, credentials=creds, ca=pki.ca.cert))
    assert Access(tls_nats.url, credentials=creds).user == USER


async def test_a_client_without_tls_or_with_another_ca_is_refused(
        tls_nats: EmbeddedNats, pki: PKI, tmp_path: Path) -> None:
    creds = _credentials(tmp_path / "creds.json")
    for access in (Access(tls_nats.url, credentials=creds),  # the system's CAs only
                   Access(tls_nats.url, credentials=creds, ca=pki.other_ca.cert)):
        assert "certificate verify failed" in await _refused(access)


async def test_tls_asked_of_a_server_without_it_sends_no_password(
        tmp_path: Path, pki: PKI) -> None:
    with EmbeddedNats(tmp_path / "plain", extra_config=_AUTH,
                      monitoring_port=free_port()) as plain:
        creds = _credentials(tmp_path / "creds.json")
        assert await _refused(Access(plain.url, credentials=creds, ca=pki.ca.cert)) == NO_TLS
        # the server never saw the (right) password: no connection of it was ever let in
        with urllib.request.urlopen(f"{plain.monitoring_url}/connz?state=all&auth=true",
                                    timeout=SAFETY_NET_SECONDS) as reply:
            users = [c.get("authorized_user") for c in json.load(reply)["connections"] or []]
        assert USER not in users, users
        await _round_trip(Access(plain.url, credentials=creds))  # the password was right
    with EmbeddedNats(tmp_path / "open") as anonymous:  # nothing to send, still refused
        assert await _refused(Access(anonymous.url, ca=pki.ca.cert)) == NO_TLS


async def test_routes_are_mutual_tls(tmp_path: Path, pki: PKI) -> None:
    """Two servers route to each other only by certificates of the CA (as the cluster
    configs are written): the route forms, so the server certificate serves both ends."""
    routes = [free_port(), free_port()]
    urls = ", ".join(f"nats-route://127.0.0.1:{port}" for port in routes)
    route_tls = _server_tls(pki, verify=True).render().replace("\n", "\n  ")
    servers = [EmbeddedNats(tmp_path / f"n{i}", tls=_server_tls(pki),
                            monitoring_port=free_port(),
                            extra_config=f"server_name: n{i}\ncluster {{\n  name: t\n"
                                         f"  listen: 127.0.0.1:{port}\n  routes: [{urls}]\n"
                                         f"  {route_tls}}}\n")
               for i, port in enumerate(routes)]
    context = ssl.create_default_context(cafile=pki.ca.cert)
    try:
        for server in servers:
            server.start()

        async def routed() -> bool:
            with urllib.request.urlopen(f"{servers[0].monitoring_url}/routez",
                                        context=context, timeout=SAFETY_NET_SECONDS) as reply:
                return bool(json.load(reply)["num_routes"])

        await eventually(routed, what="a TLS route between the two servers")
    finally:
        for server in servers:
            server.stop()


async def test_mutual_tls_wants_a_client_certificate(tmp_path: Path, pki: PKI) -> None:
    with EmbeddedNats(tmp_path / "nats", tls=_server_tls(pki, verify=True)) as server:
        reason = await _refused(Access(server.url, ca=pki.ca.cert))
        # the alert, when it arrives before the connection drops; else the hint
        assert "certificate required" in reason or reason.endswith(NO_CLIENT_CERT), reason
        await _round_trip(Access(server.url, ca=pki.ca.cert, cert=pki.client.cert,
                                 key=pki.client.key))


def test_https_monitoring(tmp_path: Path, pki: PKI) -> None:
    with EmbeddedNats(tmp_path / "nats", tls=_server_tls(pki),
                      monitoring_port=free_port()) as server:
        assert server.monitoring_url.startswith("https://")
        context = ssl.create_default_context(cafile=pki.ca.cert)
        with urllib.request.urlopen(f"{server.monitoring_url}/varz", context=context,
                                    timeout=SAFETY_NET_SECONDS) as reply:
            assert json.load(reply)["tls_required"] is True


# -- credentials files --------------------------------------------------------------------


@pytest.mark.parametrize(("text", "mode", "says"), [
    (json.dumps({"user": USER, "password": PASSWORD}), 0o644, "chmod 600"),
    (json.dumps({"user": USER, "password": PASSWORD}), 0o640, "chmod 600"),
    ('{"user": "controlplane", "password": ', 0o600, "is not"),
    (json.dumps({"user": USER}), 0o600, "password"),
    (json.dumps({"user": "a.b", "password": PASSWORD}), 0o600, "the user must be"),
], ids=["world-readable", "group-readable", "malformed", "no-password", "dotted-user"])
async def test_an_unsafe_or_malformed_credentials_file_is_refused(
        tmp_path: Path, text: str, mode: int, says: str) -> None:
    path = tmp_path / "creds.json"
    path.write_text(text)
    path.chmod(mode)
    with pytest.raises(AccessRefused) as caught:
        read_credentials(str(path))
    assert says in str(caught.value) and PASSWORD not in str(caught.value)
    # refused before any connection is tried: nothing listens at this URL
    reason = await _refused(Access("nats://127.0.0.1:1", credentials=str(path)))
    assert says in reason


def test_credentials_repr_hides_the_password(tmp_path: Path) -> None:
    creds = read_credentials(_credentials(tmp_path / "creds.json"))
    assert PASSWORD not in repr(creds) and PASSWORD not in str(creds)


def test_a_password_in_the_url_and_a_credentials_file_are_refused(tmp_path: Path) -> None:
    access = Access(f"nats://{USER}:{PASSWORD}@127.0.0.1:1",
                    credentials=_credentials(tmp_path / "c.json"))
    assert "file only" in asyncio.run(_refused(access))


# -- no password in any log line ----------------------------------------------------------


@pytest.mark.parametrize("by", ["credentials-file", "url"])
def test_a_service_that_cannot_log_in_logs_no_password(tmp_path: Path, pki: PKI,
                                                       by: str) -> None:
    """A control plane whose password is wrong retries, one line per attempt: neither its
    lines nor its command line hold the password."""
    wrong = "wr0ng-" + PASSWORD
    with EmbeddedNats(tmp_path / "nats", tls=_server_tls(pki), extra_config=_AUTH) as server:
        if by == "url":
            url = server.url.replace("nats://", f"nats://{USER}:{wrong}@")
            flags = ["--nats-url", url]
        else:
            flags = ["--nats-url", server.url,
                     "--nats-credentials", _credentials(tmp_path / "c.json", wrong)]
        args = ["-m", "controlplane", "run", *flags, "--nats-ca", pki.ca.cert]
        with _running(args, tmp_path) as (proc, lines):
            record = lines.until(lambda r: r.get("event") == "cannot reach NATS"
                                 and r.get("attempt") == 2, "a second attempt")
            assert record["url"] == server.url
            assert record["error"] == "authorization violation"
            proc.kill()  # it retries for ever; what it has said is what is tested
            proc.wait(timeout=SAFETY_NET_SECONDS)
            output = "\n".join(lines.rest())
        assert wrong not in output and PASSWORD not in output, output
        assert "Traceback" not in output


# -- the shipped configurations -----------------------------------------------------------


def _env_for(text: str, **extra: str) -> dict[str, str]:
    names = set(_ENV_REF.findall(text))
    return {**os.environ, **dict.fromkeys(names, "test-password"), **extra}


def _check(conf: Path, cwd: Path, env: dict[str, str]) -> None:
    result = subprocess.run([str(nats_server_binary()), "-t", "-c", str(conf)], cwd=cwd,
                            env=env, capture_output=True, text=True, check=False,
                            timeout=SAFETY_NET_SECONDS)
    assert result.returncode == 0, result.stderr


_CERT_PATH = re.compile(r'^\s*(?:cert_file|key_file|ca_file):\s*"([^"]+)"', re.MULTILINE)


def _certs_where_named(text: str, cwd: Path, pki: PKI) -> None:
    """Copies of the test PKI's files at the paths the config names (relative to `cwd`)."""
    named = _CERT_PATH.findall(text)
    assert named, "no TLS files named"
    source = {"ca.crt": pki.ca.cert, "server.crt": pki.server.cert,
              "server.key": pki.server.key}
    for path in named:
        target = cwd / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source[Path(path).name], target)


@pytest.mark.parametrize("name", ["single.conf", "cluster/n1.conf", "cluster/n2.conf",
                                  "cluster/n3.conf"])
def test_every_server_config_has_tls_and_passes_the_check(tmp_path: Path, pki: PKI,
                                                          name: str) -> None:
    shutil.copytree(DEPLOY / "nats", tmp_path / "nats")
    conf = tmp_path / "nats" / name
    text = conf.read_text()
    assert re.search(r"^tls\s*\{", text, re.M), "no client TLS"
    assert re.search(r"^https:", text, re.M) and not re.search(r"^http:", text, re.M)
    if "cluster" in name:
        cluster = text[text.index("cluster {"):]
        assert re.search(r"tls\s*\{[^}]*verify:\s*true", cluster), "routes without mTLS"
    _certs_where_named(text, tmp_path, pki)
    _check(conf, tmp_path, _env_for(text))
    include = "../accounts.conf" if "/" in name else "./accounts.conf"
    conf.write_text(f"{text}\ninclude {include}\n")  # as the headers say, with accounts
    _check(conf, tmp_path, _env_for((DEPLOY / "nats" / "accounts.conf").read_text()))


def _manifests() -> list[dict[str, Any]]:
    return [d for p in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
            for d in yaml.safe_load_all(p.read_text()) if d is not None]


def test_kubernetes_nats_config_loads_the_accounts_and_tls(tmp_path: Path, pki: PKI) -> None:
    """The ConfigMap's nats.conf as the pod sees it (its mounts under tmp_path): accounts
    from their Secret, certificates from theirs, passwords from the environment."""
    config_map = next(d for d in _manifests() if d["kind"] == "ConfigMap"
                      and d["metadata"]["name"] == "virtbus-nats-config")
    text = config_map["data"]["nats.conf"]
    assert re.search(r"^include\s+\S*accounts\.conf", text, re.M), "accounts not loaded"
    etc = tmp_path / "etc" / "nats"
    (etc / "config").mkdir(parents=True)
    (etc / "accounts").mkdir()
    shutil.copy(DEPLOY / "nats" / "accounts.conf", etc / "accounts" / "accounts.conf")
    _certs_where_named(text, tmp_path, pki)
    conf = etc / "config" / "nats.conf"
    conf.write_text(text.replace('"/etc/nats/', f'"{tmp_path}/etc/nats/'))
    accounts = (DEPLOY / "nats" / "accounts.conf").read_text()
    _check(conf, tmp_path, _env_for(accounts, POD_NAME="virtbus-nats-0"))


def _pods() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in _manifests()
            if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")}


def test_kubernetes_pods_are_locked_down() -> None:
    for name, pod in _pods().items():
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            context = container.get("securityContext", {})
            assert context.get("readOnlyRootFilesystem") is True, (name, container["name"])
            assert context.get("allowPrivilegeEscalation") is False, (name, container["name"])
            assert context.get("capabilities", {}).get("drop") == ["ALL"], name
            text = json.dumps(container)
            assert "password" not in text.lower() or "secretKeyRef" in text \
                or "secretRef" in text, (name, "a password that is not from a Secret")
            assert "@" not in " ".join(container.get("args", [])), (name, "user in a URL")
        if name != "virtbus-nodeagent":
            assert pod["securityContext"]["runAsNonRoot"] is True, name


def test_kubernetes_network_policies_cover_every_component() -> None:
    policies = [d for d in _manifests() if d["kind"] == "NetworkPolicy"]
    selected = {p["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/name")
                for p in policies}
    assert {"virtbus-nats", "virtbus-controlplane", "virtbus-projections",
            "virtbus-nodeagent"} <= selected
    assert any(p["spec"]["podSelector"] == {} for p in policies), "no default deny"


def test_systemd_units_pass_no_secret_on_a_command_line() -> None:
    for unit in (DEPLOY / "systemd").glob("*.service"):
        for line in unit.read_text().splitlines():
            if line.startswith("ExecStart"):
                assert "NATS_URL" not in line and "@" not in line, (unit.name, line)

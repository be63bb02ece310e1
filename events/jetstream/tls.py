"""Certificates for NATS over TLS: a private CA, a server certificate (clients, routes and
https monitoring) and one client certificate per role (mutual TLS).

ECDSA P-256 keys, written 0600; certificates 0644. An operator with a CA of their own uses
that instead: nothing here is needed at run time, only the files.

    python -m events.jetstream.tls DIR --host nats.example --ip 10.0.0.5 --client controlplane

An existing `DIR/ca.crt` and `DIR/ca.key` are kept (run it again to renew the leaves);
every other file named is written afresh.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

import msgspec
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY: Final = timedelta(days=3650)
"""The CA outlives its leaves: renewing a leaf needs no new trust anchor anywhere."""
LEAF_VALIDITY: Final = timedelta(days=397)
"""About a year (the Web PKI's ceiling): renewed by running the script again."""
BACKDATE: Final = timedelta(minutes=5)
"""notBefore this far back, so a peer whose clock is a little behind accepts a new cert."""
CA_NAME: Final = "virtbus CA"
SERVER_NAME: Final = "server"
KEY_MODE: Final = 0o600
CERT_MODE: Final = 0o644
DIR_MODE: Final = 0o700


class CertFiles(msgspec.Struct, frozen=True):
    """Where one certificate, its key and the CA certificate that signed it were written
    (for the CA itself, `ca` is `cert`)."""

    cert: str
    key: str
    ca: str


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Created 0600 (never readable by others, not even for a moment), and made 0600 if it
    was already there with another mode."""
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, KEY_MODE)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), KEY_MODE)
        f.write(pem)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.chmod(CERT_MODE)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "virtbus"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey,
             validity: timedelta) -> x509.CertificateBuilder:
    now = datetime.now(UTC)
    return (x509.CertificateBuilder()
            .subject_name(_name(subject)).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + validity)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False))


def make_ca(directory: Path | str) -> CertFiles:
    """A new self-signed CA in `directory`: `ca.crt`, `ca.key`."""
    out = Path(directory)
    out.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    key = _new_key()
    cert = (_builder(CA_NAME, _name(CA_NAME), key, CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    files = CertFiles(cert=str(out / "ca.crt"), key=str(out / "ca.key"), ca=str(out / "ca.crt"))
    _write_key(Path(files.key), key)
    _write_cert(Path(files.cert), cert)
    return files


def load_ca(directory: Path | str) -> CertFiles | None:
    """The CA `make_ca` wrote in `directory`, if both its files are there."""
    out = Path(directory)
    cert, key = out / "ca.crt", out / "ca.key"
    if not (cert.exists() and key.exists()):
        return None
    return CertFiles(cert=str(cert), key=str(key), ca=str(cert))


def _issue(ca: CertFiles, directory: Path | str, name: str, *, common_name: str,
           usages: list[x509.ObjectIdentifier],
           alt_names: list[x509.GeneralName]) -> CertFiles:
    out = Path(directory)
    out.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    ca_cert = x509.load_pem_x509_certificate(Path(ca.cert).read_bytes())
    ca_key = serialization.load_pem_private_key(Path(ca.key).read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.key}: not an ECDSA key (make the CA with events.jetstream.tls)")
    key = _new_key()
    builder = (_builder(common_name, ca_cert.subject, key, LEAF_VALIDITY)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                            content_commitment=False, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=False,
                                            crl_sign=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   ca_key.public_key()), critical=False))
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    files = CertFiles(cert=str(out / f"{name}.crt"), key=str(out / f"{name}.key"), ca=ca.cert)
    _write_key(Path(files.key), key)
    _write_cert(Path(files.cert), cert)
    return files


def make_server_cert(ca: CertFiles, directory: Path | str, hostnames: list[str],
                     ips: list[str]) -> CertFiles:
    """`server.crt` / `server.key` for every name and address clients and peers dial.

    Valid for server and client authentication both: a route is a TLS client of the
    server it dials, and with `verify: true` its certificate must say so."""
    if not hostnames and not ips:
        raise ValueError("a server certificate needs at least one host name or IP address")
    alt: list[x509.GeneralName] = [x509.DNSName(h) for h in hostnames]
    alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    return _issue(ca, directory, SERVER_NAME, common_name=(hostnames or ips)[0],
                  usages=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
                  alt_names=alt)


def make_client_cert(ca: CertFiles, directory: Path | str, name: str) -> CertFiles:
    """`<name>.crt` / `<name>.key`, common name `name` (a role or a user: what a server with
    `verify_and_map` would map it to)."""
    if not name or "/" in name or name in (SERVER_NAME, "ca"):
        raise ValueError(f"{name!r} cannot name a client certificate")
    return _issue(ca, directory, name, common_name=name,
                  usages=[ExtendedKeyUsageOID.CLIENT_AUTH], alt_names=[])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m events.jetstream.tls",
                                description=__doc__.splitlines()[0])
    p.add_argument("directory", type=Path)
    p.add_argument("--host", action="append", default=[], metavar="NAME",
                   help="a DNS name of the server (repeat; wildcards like *.svc allowed)")
    p.add_argument("--ip", action="append", default=[], metavar="ADDRESS",
                   help="an IP address of the server (repeat)")
    p.add_argument("--client", action="append", default=[], metavar="NAME",
                   help="also a client certificate for NAME (repeat)")
    args = p.parse_args(argv)
    if not args.host and not args.ip:
        p.error("give the server's names: --host NAME and/or --ip ADDRESS")
    try:
        ca = load_ca(args.directory)
        if ca is None:
            ca = make_ca(args.directory)
            print(f"CA: {ca.cert} (new)")
        else:
            print(f"CA: {ca.cert} (kept)")
        server = make_server_cert(ca, args.directory, args.host, args.ip)
        print(f"server: {server.cert} for {', '.join([*args.host, *args.ip])}")
        for name in args.client:
            print(f"client: {make_client_cert(ca, args.directory, name).cert}")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

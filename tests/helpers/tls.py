"""Certificates made in the test: a CA, a server certificate for 127.0.0.1, a client
certificate, and bad ones (expired, a key that does not match), written as PEM files."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: EC P-256 keys: generated in milliseconds (RSA 2048 takes ~100 ms each under load).
CURVE = ec.SECP256R1()


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(CURVE)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    expired_cert: Path
    expired_key: Path
    other_key: Path
    #: A client certificate from a CA the broker does not trust.
    rogue_cert: Path
    rogue_key: Path


def _issue(issuer_key: ec.EllipticCurvePrivateKey, issuer: x509.Name, cn: str,
           key: ec.EllipticCurvePrivateKey, *, server: bool, days: tuple[int, int] = (-1, 30),
           ) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now + dt.timedelta(days=days[0]))
               .not_valid_after(now + dt.timedelta(days=days[1]))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        usage = ExtendedKeyUsageOID.SERVER_AUTH
    else:
        usage = ExtendedKeyUsageOID.CLIENT_AUTH
    builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("amqlite test CA")
    rogue_ca_key, rogue_ca = _ca("someone else's CA")
    server_key, client_key, expired_key, rogue_key = _key(), _key(), _key(), _key()
    d = directory
    return Pki(
        ca=_write_cert(ca_cert, d / "ca.pem"),
        server_cert=_write_cert(_issue(ca_key, ca_cert.subject, "127.0.0.1", server_key,
                                       server=True), d / "server.pem"),
        server_key=_write_key(server_key, d / "server.key"),
        client_cert=_write_cert(_issue(ca_key, ca_cert.subject, "alice", client_key,
                                       server=False), d / "client.pem"),
        client_key=_write_key(client_key, d / "client.key"),
        expired_cert=_write_cert(_issue(ca_key, ca_cert.subject, "127.0.0.1", expired_key,
                                        server=True, days=(-30, -1)), d / "expired.pem"),
        expired_key=_write_key(expired_key, d / "expired.key"),
        other_key=_write_key(_key(), d / "other.key"),
        rogue_cert=_write_cert(_issue(rogue_ca_key, rogue_ca.subject, "mallory", rogue_key,
                                      server=False), d / "rogue.pem"),
        rogue_key=_write_key(rogue_key, d / "rogue.key"),
    )

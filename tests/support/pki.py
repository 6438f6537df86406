"""A throwaway public key infrastructure for the TLS tests, made at test time
(cryptography): a CA, a server certificate for 127.0.0.1/localhost, a client certificate,
and another CA that signed nothing."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
    usage: x509.ObjectIdentifier | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),  # fmt: skip
            critical=True,
        )
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(where: Path) -> Pki:
    """A CA, a server certificate for localhost and 127.0.0.1 and a client certificate it
    signed, and a CA that signed nothing, as PEM files in ``where``."""
    ca_key = _key()
    ca = _certificate("rmqstore test CA", ca_key, None, ca_key, ca=True)
    server_key = _key()
    server = _certificate(
        "rmqstore test server", server_key, ca.subject, ca_key,
        sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
    )  # fmt: skip
    client_key = _key()
    client = _certificate("rmqstore test client", client_key, ca.subject, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    other_key = _key()
    other = _certificate("some other CA", other_key, None, other_key, ca=True)
    return Pki(
        ca=_write_cert(ca, where / "ca.crt"),
        server_cert=_write_cert(server, where / "tls.crt"),
        server_key=_write_key(server_key, where / "tls.key"),
        client_cert=_write_cert(client, where / "client.crt"),
        client_key=_write_key(client_key, where / "client.key"),
        other_ca=_write_cert(other, where / "other-ca.crt"),
    )

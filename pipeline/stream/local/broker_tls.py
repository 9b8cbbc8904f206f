"""The embedded broker's mutual-TLS files: one certificate authority per deployment, a server and a
client certificate it signed, and nothing that can sign another.

:mod:`pipeline.stream.local.broker_gate` accepts a connection only from a client presenting a certificate
signed by the deployment's authority; the authority's private key is dropped as soon as both certificates
are signed, so the client key (owner-only, like every file here) is the one credential there is. The
directory is kept with the deployment's state (``$DPSTREAM_HOME/<name>/broker-tls``, mode 0700) so that the
curator's own tools keep working across restarts of ``dpstream up``; deleting it rotates everything at the
next ``up`` (docs/security.md, "The embedded broker").
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from pipeline.stream.local.service_process import private_dir, private_file

__all__ = ["BROKER_TLS_ENV", "BrokerTls", "ensure_broker_tls"]

BROKER_TLS_ENV = (
    "DPSTREAM_BROKER_TLS"  # the directory of these files, for this process tree's broker clients
)
VALIDITY = datetime.timedelta(
    days=3650
)  # a local deployment's lifetime; rotation is deleting the directory


@dataclass(frozen=True)
class BrokerTls:
    """The files of one deployment's broker gate (every path inside ``directory``)."""

    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    @property
    def client_cert(self) -> Path:
        return self.directory / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.directory / "client.key"

    def complete(self) -> bool:
        return all(
            p.is_file()
            for p in (
                self.ca_file,
                self.server_cert,
                self.server_key,
                self.client_cert,
                self.client_key,
            )
        )


def ensure_broker_tls(directory: Path, label: str = "dpstream") -> BrokerTls:
    """The files in ``directory`` (0700), generated when any is missing: a fresh authority (P-256),
    a server certificate for 127.0.0.1/localhost and a client certificate; the authority's key is
    never written."""
    tls = BrokerTls(private_dir(directory))
    if tls.complete():
        return tls
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate(f"{label} broker CA", ca_key.public_key(), ca_key, None, authority=True)
    server_key, client_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    server = _certificate("127.0.0.1", server_key.public_key(), ca_key, ca, server=True)
    client = _certificate(f"{label} curator", client_key.public_key(), ca_key, ca)

    def pem_key(key) -> str:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()

    def pem_cert(cert) -> str:
        return cert.public_bytes(serialization.Encoding.PEM).decode()

    private_file(tls.server_key, pem_key(server_key))
    private_file(tls.client_key, pem_key(client_key))
    private_file(tls.server_cert, pem_cert(server))
    private_file(tls.client_cert, pem_cert(client))
    private_file(
        tls.ca_file, pem_cert(ca)
    )  # last: complete() is true only once every file is written
    return tls


def _certificate(
    common_name: str, public_key, signing_key, issuer, authority: bool = False, server: bool = False
):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer is not None else name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(
            x509.BasicConstraints(ca=authority, path_length=0 if authority else None), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signing_key.public_key()),
            critical=False,
        )
    if authority:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
    return builder.sign(signing_key, hashes.SHA256())

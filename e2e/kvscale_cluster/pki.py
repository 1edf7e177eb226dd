"""Certificates and keys for the local control plane, made with ``cryptography``.

One CA signs the API server's serving certificate and the front proxy's client certificate (the
API server presents it to aggregated API servers such as KEDA's metrics adapter, which trust the
CA from ``--requestheader-client-ca-file``); a separate RSA key pair signs and verifies
service-account tokens (TokenRequest needs it). Clients authenticate with a static admin token.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ADMIN_USER = "kvscale-admin"
KUBELET_CLIENT = "kube-apiserver-kubelet-client"
FRONT_PROXY_CN = "front-proxy-client"
VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Pki:
    """Paths of the files the control plane reads, plus the admin bearer token."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    token_file: Path
    admin_token: str
    kubelet_client_cert: Path
    kubelet_client_key: Path
    proxy_client_cert: Path
    proxy_client_key: Path


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(key: rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(key: rsa.RSAPrivateKey) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name("kvscale-local-ca"))
        .issuer_name(_name("kvscale-local-ca"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )


def _leaf(
    key: rsa.RSAPrivateKey,
    ca: x509.Certificate,
    ca_key: rsa.RSAPrivateKey,
    subject: x509.Name,
    usages: list[x509.ObjectIdentifier],
    sans: list[x509.GeneralName],
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _serving(
    key: rsa.RSAPrivateKey, ca: x509.Certificate, ca_key: rsa.RSAPrivateKey, ips: list[str]
) -> x509.Certificate:
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    dns.append("kubernetes.default.svc.cluster.local")
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    usages = [ExtendedKeyUsageOID.SERVER_AUTH]
    return _leaf(key, ca, ca_key, _name("kube-apiserver"), usages, sans)


def create_pki(directory: Path, server_ips: list[str]) -> Pki:
    """Write a fresh CA, serving certificate for ``server_ips``, SA key pair and token file."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        token_file=directory / "tokens.csv",
        admin_token=secrets.token_hex(24),
        kubelet_client_cert=directory / "apiserver-kubelet-client.crt",
        kubelet_client_key=directory / "apiserver-kubelet-client.key",
        proxy_client_cert=directory / "front-proxy-client.crt",
        proxy_client_key=directory / "front-proxy-client.key",
    )
    ca_key, serving_key, sa_key = _key(), _key(), _key()
    ca = _ca(ca_key)
    _write_key(ca_key, pki.ca_key)
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(serving_key, pki.serving_key)
    serving = _serving(serving_key, ca, ca_key, server_ips)
    pki.serving_cert.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    _write_key(sa_key, pki.sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    # token,user,uid,"group1,group2"
    pki.token_file.write_text(f'{pki.admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
    pki.token_file.chmod(0o600)
    # the API server's identity towards a real kubelet (logs, exec), which authorises it by CA
    issue_certificate(
        pki, pki.kubelet_client_cert, pki.kubelet_client_key, KUBELET_CLIENT, ["system:masters"], []
    )
    # the front proxy's identity towards aggregated API servers (--proxy-client-cert-file)
    issue_certificate(pki, pki.proxy_client_cert, pki.proxy_client_key, FRONT_PROXY_CN, [], [])
    return pki


def issue_certificate(
    ca: Pki | tuple[Path, Path],
    cert: Path,
    key: Path,
    cn: str,
    organizations: list[str],
    ips: list[str],
    dns: list[str] | None = None,
) -> None:
    """Write a key and a certificate from the cluster CA (a ``Pki``, or its certificate and key
    files) for ``cn`` (groups ``organizations``): a client certificate the API server accepts
    (``--client-ca-file``), also serving ``ips`` and ``dns`` names when given (the real node's
    kubelet, which the API server checks against the same CA; KEDA's mutual TLS)."""
    ca_cert_path, ca_key_path = (ca.ca_cert, ca.ca_key) if isinstance(ca, Pki) else ca
    ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    assert isinstance(ca_key, rsa.RSAPrivateKey)
    leaf_key = _key()
    names = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    subject = x509.Name([*names, x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    serving = [ExtendedKeyUsageOID.SERVER_AUTH] if ips or dns else []
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH, *serving]
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns or []]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    _write_key(leaf_key, key)
    leaf = _leaf(leaf_key, ca_cert, ca_key, subject, usages, sans)
    cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))

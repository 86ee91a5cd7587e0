"""Certificates and kubeconfigs for the test control plane (tests/controlplane.py), made
with `cryptography`: a CA, the apiserver's serving certificate, an admin client
certificate (system:masters) and the ServiceAccount signing key."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

Json = dict[str, Any]


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _cert(
    subject: x509.Name,
    key: rsa.RSAPrivateKey,
    issuer: tuple[x509.Name, rsa.RSAPrivateKey] | None = None,
    ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
    server: bool = False,
    client_too: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name, signer = issuer or (subject, key)
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        b = b.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), True
        )
    else:
        usage = x509.oid.ExtendedKeyUsageOID
        usages = [usage.SERVER_AUTH if server else usage.CLIENT_AUTH]
        if server and client_too:
            usages.append(usage.CLIENT_AUTH)
        b = b.add_extension(x509.ExtendedKeyUsage(usages), False)
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return b.sign(signer, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common: str, organization: str | None = None) -> x509.Name:
    org = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)] if organization else []
    return x509.Name([*org, x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _sans(ips: list[str], dns: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    return names + [x509.DNSName(n) for n in dns]


def _ca(path: Path, common: str) -> tuple[x509.Name, rsa.RSAPrivateKey]:
    """A self-signed CA, its certificate written to `path`: its name and key, to sign with."""
    name, key = _name(common), _key()
    path.write_bytes(_pem(_cert(name, key, ca=True)))
    return name, key


def _issue(
    d: Path, stem: str, subject: x509.Name, ca: tuple[x509.Name, rsa.RSAPrivateKey], **kw: Any
) -> None:
    """A certificate signed by `ca` and its key, written to STEM.crt and STEM.key in `d`."""
    key = _key()
    (d / f"{stem}.crt").write_bytes(_pem(_cert(subject, key, ca, **kw)))
    (d / f"{stem}.key").write_bytes(_pem_key(key))


def make_pki(d: Path) -> None:
    """ca.crt, apiserver.{crt,key} (127.0.0.1, localhost, kubernetes.default.svc),
    admin.{crt,key} (system:masters) and the ServiceAccount signing key sa.{key,pub}."""
    ca = _ca(d / "ca.crt", "gpuscaler-test-ca")
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    sans = _sans(["127.0.0.1", "10.0.0.1"], dns)
    _issue(d, "apiserver", _name("kube-apiserver"), ca, sans=sans, server=True)
    _issue(d, "admin", _name("admin", "system:masters"), ca)
    sa = _key()
    (d / "sa.key").write_bytes(_pem_key(sa))
    public = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    (d / "sa.pub").write_bytes(sa.public_key().public_bytes(*public))


def make_front_proxy_pki(d: Path) -> None:
    """The aggregation layer's own CA and the apiserver's proxy client certificate, as
    kubeadm makes them (front-proxy-ca.crt, front-proxy-client.{crt,key}, CN
    front-proxy-client): the apiserver presents it when it proxies a request to an
    aggregated API server, which trusts the X-Remote-User/-Group headers only from it."""
    ca = _ca(d / "front-proxy-ca.crt", "front-proxy-ca")
    _issue(d, "front-proxy-client", _name("front-proxy-client"), ca)


def make_mutual_tls_dir(d: Path, common_name: str, dns_names: list[str]) -> None:
    """ca.crt, tls.crt and tls.key in `d`, as a cert-manager or Kubernetes TLS Secret
    mounts them: one certificate for both ends of a mutual-TLS link (server and client
    usage), valid for 127.0.0.1 and `dns_names`."""
    ca = _ca(d / "ca.crt", f"{common_name}-ca")
    sans = _sans(["127.0.0.1"], dns_names)
    _issue(d, "tls", _name(common_name), ca, sans=sans, server=True, client_too=True)


def write_kubeconfig(path: Path, server: str, ca: Path, user: Json) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(doc))
    return path

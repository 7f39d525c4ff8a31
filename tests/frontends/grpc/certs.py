"""Test certificates made at test time: a CA, a server certificate for localhost / 127.0.0.1, a client certificate
the CA signed, and one from a CA the server does not trust."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # signed by a CA the server does not know
    stranger_key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, issuer_key: ec.EllipticCurvePrivateKey,
           ca: bool = False, server: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_certs(folder: Path) -> Certs:
    def write(name: str, cert: x509.Certificate | None = None, key: ec.EllipticCurvePrivateKey | None = None) -> Path:
        path = folder / name
        if cert is not None:
            path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        else:
            assert key is not None
            path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return path

    keys = {name: ec.generate_private_key(ec.SECP256R1()) for name in ("ca", "server", "client", "other", "stranger")}
    ca = _issue("naiad test CA", keys["ca"], "naiad test CA", keys["ca"], ca=True)
    other = _issue("another CA", keys["other"], "another CA", keys["other"], ca=True)
    return Certs(
        ca=write("ca.pem", ca),
        server_cert=write("server.pem", _issue("localhost", keys["server"], "naiad test CA", keys["ca"], server=True)),
        server_key=write("server.key", key=keys["server"]),
        client_cert=write("client.pem", _issue("client", keys["client"], "naiad test CA", keys["ca"])),
        client_key=write("client.key", key=keys["client"]),
        stranger_cert=write("stranger.pem", _issue("stranger", keys["stranger"], "another CA", keys["other"])),
        stranger_key=write("stranger.key", key=keys["stranger"]),
    )

"""Test certificates made with `cryptography`: a CA, a server certificate for 127.0.0.1 and
localhost, client certificates with chosen subjects; PEM files in a folder."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    folder: Path
    _ca_key: object
    _ca_cert: object

    def client(self, name: str, subject: list[tuple[object, str]],
               signed_by_ca: bool = True) -> tuple[Path, Path]:
        """(certificate file, key file) of a client certificate with `subject`."""
        key = ec.generate_private_key(ec.SECP256R1())
        issuer_key, issuer = (self._ca_key, self._ca_cert.subject) if signed_by_ca else (
            key, _name(subject))
        cert = _builder(_name(subject), issuer, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False,
        ).sign(issuer_key, hashes.SHA256())
        return _write(self.folder, name, cert, key)


def _name(parts) -> x509.Name:
    return x509.Name([x509.NameAttribute(oid, value) for oid, value in parts])


def _builder(subject, issuer, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2)))


def _write(folder: Path, name: str, cert, key) -> tuple[Path, Path]:
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def make_certs(folder: Path) -> Certs:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name([(NameOID.COMMON_NAME, "Mink test CA")])
    ca_cert = _builder(ca_name, ca_name, ca_key.public_key()).add_extension(
        x509.BasicConstraints(ca=True, path_length=None), critical=True,
    ).add_extension(
        x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                      content_commitment=False, key_encipherment=False,
                      data_encipherment=False, key_agreement=False, encipher_only=False,
                      decipher_only=False), critical=True,
    ).sign(ca_key, hashes.SHA256())
    ca_path = folder / "ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _builder(_name([(NameOID.COMMON_NAME, "localhost")]), ca_cert.subject,
                      server_key.public_key()).add_extension(
        x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                     x509.IPAddress(ip_address("127.0.0.1"))]),
        critical=False,
    ).add_extension(
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False,
    ).sign(ca_key, hashes.SHA256())
    cert_path, key_path = _write(folder, "server", server, server_key)
    return Certs(ca_path, cert_path, key_path, folder, ca_key, ca_cert)

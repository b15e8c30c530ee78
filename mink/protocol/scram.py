"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677): the server side, as Kafka's
ScramSaslServer (`mink/broker/security/sasl.py` runs it); the client side, for Mink's own
tools (`mink/client.py`); and the credential formulas shared with AlterUserScramCredentials
and PLAIN. Pure: no I/O (callers look credentials up and run PBKDF2 off the event loop).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ScramMechanism:
    name: str          # SASL mechanism name
    code: int          # Kafka's ScramMechanism id in APIs 50 and 51
    hash_name: str
    min_iterations: int = 4096
    max_iterations: int = 16384  # Kafka's bound for AlterUserScramCredentials


SCRAM_SHA_256 = ScramMechanism("SCRAM-SHA-256", 1, "sha256")
SCRAM_SHA_512 = ScramMechanism("SCRAM-SHA-512", 2, "sha512")
MECHANISMS = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
BY_CODE = {m.code: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def salted_password(mechanism: ScramMechanism, password: bytes, salt: bytes,
                    iterations: int) -> bytes:
    """Hi() of RFC 5802: PBKDF2-HMAC. CPU-bound: call it through trio.to_thread."""
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password, salt, iterations)


def credential_from_salted(mechanism: ScramMechanism, salted: bytes, salt: bytes,
                           iterations: int) -> ScramCredential:
    client_key = _hmac(mechanism, salted, b"Client Key")
    return ScramCredential(salt, _h(mechanism, client_key),
                           _hmac(mechanism, salted, b"Server Key"), iterations)


def new_credential(mechanism: ScramMechanism, password: str,
                   iterations: int = 4096) -> ScramCredential:
    salt = os.urandom(32)
    return credential_from_salted(
        mechanism, salted_password(mechanism, password.encode(), salt, iterations), salt,
        iterations)


def password_matches(mechanism: ScramMechanism, credential: ScramCredential,
                     salted: bytes) -> bool:
    """Whether a password salted with the credential's salt and iterations is its password."""
    client_key = _hmac(mechanism, salted, b"Client Key")
    return hmac.compare_digest(_h(mechanism, client_key), credential.stored_key)


def _hmac(mechanism: ScramMechanism, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, mechanism.hash_name).digest()


def _h(mechanism: ScramMechanism, data: bytes) -> bytes:
    return hashlib.new(mechanism.hash_name, data).digest()


class ScramError(Exception):
    """The exchange failed; the message is for the log, the client gets Kafka's text."""


def _saslname(value: str) -> str:
    if re.search(r"=(?!2C|3D)", value):
        raise ScramError(f"invalid username encoding {value!r}")
    return value.replace("=2C", ",").replace("=3D", "=")


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ScramError(f"malformed SCRAM attribute {part!r}")
        out.setdefault(part[0], part[2:])
    return out


class ScramServer:
    """One exchange: `client_first` → server-first message, `client_final` → server-final.
    The credential is handed in after `client_first` named the user (`username`)."""

    def __init__(self, mechanism: ScramMechanism) -> None:
        self.mechanism = mechanism
        self.username: str | None = None
        self._client_first_bare = ""
        self._gs2 = ""
        self._nonce = ""
        self._server_first = ""
        self._credential: ScramCredential | None = None

    def parse_client_first(self, data: bytes) -> str:
        """Reads the client-first message; returns the user name to look up."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("client-first message is not UTF-8") from None
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise ScramError("malformed client-first message")
        cbind, authzid, bare = parts
        if cbind not in ("n", "y"):
            raise ScramError("channel binding is not supported")
        fields = bare.split(",")
        if any(f.startswith("tokenauth=") for f in fields[2:]):
            raise ScramError("delegation tokens are not supported")
        attrs = _attributes(",".join(f for f in fields[:2]))  # Kafka's extensions follow
        if "n" not in attrs or "r" not in attrs or not attrs["r"]:
            raise ScramError("client-first message lacks a user name or nonce")
        username = _saslname(attrs["n"])
        if authzid:
            if not authzid.startswith("a=") or _saslname(authzid[2:]) != username:
                raise ScramError("authorization id differs from the user name")
        self.username = username
        self._client_first_bare = bare
        self._gs2 = f"{cbind},{authzid},"
        self._nonce = attrs["r"]
        return username

    def server_first(self, credential: ScramCredential) -> bytes:
        self._credential = credential
        self._nonce += base64.b64encode(os.urandom(24)).decode().rstrip("=")
        self._server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},"
                              f"i={credential.iterations}")
        return self._server_first.encode()

    def client_final(self, data: bytes) -> bytes:
        """Checks the client's proof; returns the server-final message."""
        credential = self._credential
        if credential is None:
            raise ScramError("client-final message before client-first")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("client-final message is not UTF-8") from None
        without_proof, sep, proof_part = text.rpartition(",p=")
        if not sep:
            raise ScramError("client-final message has no proof")
        attrs = _attributes(without_proof)
        # As Kafka's ScramSaslServer: the nonce must end with ours (librdkafka up to 2.0
        # sends its own nonce again in front of it); the proof covers what was sent.
        if not attrs.get("r", "").endswith(self._nonce):
            raise ScramError("invalid nonce in the client-final message")
        try:
            if base64.b64decode(attrs.get("c", ""), validate=True) != self._gs2.encode():
                raise ScramError("channel binding mismatch")
            proof = base64.b64decode(proof_part, validate=True)
        except (ValueError, TypeError):
            raise ScramError("malformed base64 in client-final message") from None
        auth_message = ",".join((self._client_first_bare, self._server_first,
                                 without_proof)).encode()
        m = self.mechanism
        signature = _hmac(m, credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError("invalid proof length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(_h(m, client_key), credential.stored_key):
            raise ScramError("invalid credentials")
        server_signature = _hmac(m, credential.server_key, auth_message)
        return b"v=" + base64.b64encode(server_signature)


def _saslname_encode(value: str) -> str:
    return value.replace("=", "=3D").replace(",", "=2C")


class ScramClient:
    """The client's side of one exchange: `first()`, then `final(server_first)`, then
    `verify(server_final)`."""

    def __init__(self, mechanism: ScramMechanism, username: str, password: str) -> None:
        self.mechanism = mechanism
        self._bare = f"n={_saslname_encode(username)},r={base64.b64encode(os.urandom(24)).decode()}"
        self._nonce = self._bare.split(",r=", 1)[1]
        self._password = password.encode()
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self._bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode("utf-8")
        attrs = _attributes(text)
        nonce, salt, iterations = attrs.get("r", ""), attrs.get("s", ""), attrs.get("i", "")
        if not nonce.startswith(self._nonce) or not iterations.isdigit():
            raise ScramError("malformed server-first message")
        m = self.mechanism
        salted = salted_password(m, self._password, base64.b64decode(salt), int(iterations))
        without_proof = f"c=biws,r={nonce}"
        auth_message = ",".join((self._bare, text, without_proof)).encode()
        client_key = _hmac(m, salted, b"Client Key")
        signature = _hmac(m, _h(m, client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self._server_signature = _hmac(m, _hmac(m, salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        attrs = _attributes(server_final.decode("utf-8"))
        if "e" in attrs:
            raise ScramError(f"the server refused: {attrs['e']}")
        if not hmac.compare_digest(base64.b64decode(attrs.get("v", "")),
                                   self._server_signature):
            raise ScramError("the server's signature does not match: not the real server")


__all__ = ["BY_CODE", "MECHANISMS", "SCRAM_SHA_256", "SCRAM_SHA_512", "ScramCredential",
           "ScramClient", "ScramError", "ScramMechanism", "ScramServer", "credential_from_salted",
           "new_credential", "password_matches", "salted_password"]

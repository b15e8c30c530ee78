"""Who asks the admin listener for data (the key lookups, /kv/...): HTTP Basic, checked against
the SCRAM credentials in PostgreSQL, and the authorizer's READ on the topic.

Required once the authorizer is on or any Kafka listener of the node uses SASL: then the
Kafka listeners only serve data to an authenticated principal, and the admin listener must
not be the way around them. Otherwise (`mink dev`, a PLAINTEXT-only node) lookups stay open,
as before. /healthz, /readyz, /metrics and the console are never authenticated: they carry
no record data, and probes and Prometheus scrape them without credentials.

- The password is checked as SASL/PLAIN checks it (`sasl.verify_password`: the salted
  password derived with the stored salt and iterations off the trio thread, compared to the
  stored key). A success is remembered for `CACHE_SECONDS` (a lookup per key must not cost a
  key derivation each), so a changed or deleted password stops working within that.
- A wrong or absent password: 401 with `WWW-Authenticate`, one log line, after Kafka's
  `connection_failed_authentication_delay_ms` (KIP-306).
- A node that does not lead the partition forwards the lookup to the leader logged in as
  the inter-broker user, carrying the original principal and client host in
  `x-mink-principal` / `x-mink-client-host`, as an Envelope does: the leader believes them
  only from a principal with CLUSTER_ACTION on the cluster (403 otherwise), then checks
  READ for the carried principal itself.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from dataclasses import dataclass
from urllib.parse import quote, unquote

import trio

from mink.broker.security.authorizer import CLUSTER_ACTION
from mink.broker.security.principal import USER_TYPE, KafkaPrincipal
from mink.broker.security.sasl import verify_password

log = logging.getLogger(__name__)

PRINCIPAL_HEADER = b"x-mink-principal"
CLIENT_HOST_HEADER = b"x-mink-client-host"
CACHE_SECONDS = 10.0
CACHE_ENTRIES = 1024


@dataclass(frozen=True, slots=True)
class Requester:
    """What the authorizer reads of a request: its principal and client host."""

    principal: KafkaPrincipal
    client_host: str


class Refused(Exception):
    """The lookup is refused: 401 (not authenticated) or 403 (not allowed)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def header(scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


class AdminAuth:
    def __init__(self, node) -> None:
        self.node = node
        config = node.config
        listeners, _ = config.kafka_listeners()
        self.required = config.authorizer_enabled or any(
            lst.protocol.sasl for lst in listeners)
        self.failure_delay = config.connection_failed_authentication_delay_ms / 1000
        self._verified: dict[bytes, float] = {}  # digest of user and password -> until when

    async def requester(self, scope) -> Requester | None:
        """Who asks (the carried principal of a forwarded lookup, if believed); None when
        no authentication is required. Refused(401 or 403) otherwise."""
        if not self.required:
            return None
        client = scope.get("client") or ("?", 0)
        authenticated = Requester(await self._authenticate(scope, client[0]), client[0])
        carried = header(scope, PRINCIPAL_HEADER)
        if carried is None:
            return authenticated
        authorizer = self.node.authorizer
        if authorizer.enabled and not authorizer.cluster(authenticated, CLUSTER_ACTION):
            log.info("admin listener: %s from %s carried a principal without CLUSTER_ACTION",
                     authenticated.principal, client[0])
            raise Refused(403, "only another node may carry a principal")
        kind, _, name = unquote(carried.decode("latin-1")).partition(":")
        if not kind or not name:
            raise Refused(403, "a carried principal is Type:name")
        host = header(scope, CLIENT_HOST_HEADER)
        return Requester(KafkaPrincipal(kind, name),
                         host.decode("latin-1") if host else authenticated.client_host)

    async def _authenticate(self, scope, peer: str) -> KafkaPrincipal:
        user, password, problem = _basic(header(scope, b"authorization"))
        if problem is None:
            digest = hashlib.sha256(user.encode() + b"\0" + password.encode()).digest()
            now = trio.current_time()
            if self._verified.get(digest, -1.0) > now:
                return KafkaPrincipal(USER_TYPE, user)
            problem = await verify_password(self.node.metadata, user, password)
            if problem is None:
                if len(self._verified) >= CACHE_ENTRIES:
                    self._verified.clear()
                self._verified[digest] = now + CACHE_SECONDS
                return KafkaPrincipal(USER_TYPE, user)
        log.info("admin listener: failed authentication from %s (%s)", peer, problem)
        await trio.sleep(self.failure_delay)  # KIP-306
        raise Refused(401, "authentication failed: invalid username or password")

    def forwarding_headers(self, requester: Requester | None) -> list[tuple[bytes, bytes]] | None:
        """The headers a lookup forwarded to the leader carries: none when no
        authentication is required; None when it is and this node has no inter-broker
        credentials to log in with (then it is not forwarded)."""
        if requester is None:
            return []
        config = self.node.config
        user, password = config.inter_broker_sasl_username, config.inter_broker_sasl_password
        if not user or password is None:
            return None
        login = base64.b64encode(f"{user}:{password}".encode()).decode()
        return [(b"authorization", f"Basic {login}".encode()),
                (PRINCIPAL_HEADER, quote(str(requester.principal), safe=":").encode()),
                (CLIENT_HOST_HEADER, requester.client_host.encode("latin-1", "replace"))]


def _basic(value: bytes | None) -> tuple[str, str, str | None]:
    """(user, password, None) of an `Authorization: Basic` header, or why not."""
    if value is None:
        return "", "", "no credentials"
    scheme, _, token = value.partition(b" ")
    if scheme.lower() != b"basic":
        return "", "", "not HTTP Basic"
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).decode(
            "utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return "", "", "malformed HTTP Basic credentials"
    if not sep or not user or not password:
        return "", "", "empty user name or password"
    return user, password, None


__all__ = ["AdminAuth", "Refused", "Requester"]

"""SASL on a connection (Kafka's SaslServerAuthenticator): SaslHandshake (API 17), then
SaslAuthenticate (API 36) until the mechanism is done; PLAIN and SCRAM-SHA-256/512 against
the SCRAM credentials in PostgreSQL; re-authentication (KIP-368).

Before a connection is authenticated only ApiVersions and SaslHandshake (then only
SaslAuthenticate) are served; anything else closes it, as Kafka does. A failed
authentication is answered SASL_AUTHENTICATION_FAILED after
`connection_failed_authentication_delay_ms` (KIP-306), logged in one line, and the
connection is closed. With `connections_max_reauth_ms`, a session lasts that long (told to
the client in SaslAuthenticate v1+'s session_lifetime_ms); a request after it ended that is
not a re-authentication closes the connection.
"""

from __future__ import annotations

import enum
import logging

import trio
from kio.schema.errors import ErrorCode

from mink.protocol.apis import ApiKey

from mink.protocol import scram
from mink.broker.security.principal import USER_TYPE, KafkaPrincipal

log = logging.getLogger(__name__)

PLAIN = "PLAIN"
SUPPORTED = (PLAIN, *scram.MECHANISMS)


def enabled_mechanisms(value: str) -> tuple[str, ...]:
    names = tuple(m.strip().upper() for m in value.split(",") if m.strip())
    unknown = [m for m in names if m not in SUPPORTED]
    if unknown:
        raise ValueError(f"sasl_enabled_mechanisms: {', '.join(unknown)} not supported "
                         f"(supported: {', '.join(SUPPORTED)})")
    return names


class State(enum.Enum):
    HANDSHAKE = "handshake"          # expects ApiVersions or SaslHandshake
    AUTHENTICATE = "authenticate"    # expects SaslAuthenticate
    AUTHENTICATED = "authenticated"
    FAILED = "failed"                # the response says so; the connection closes


class Outcome:
    """What a SaslAuthenticate is answered."""

    def __init__(self, error: ErrorCode = ErrorCode.none, message: str | None = None,
                 token: bytes = b"", session_lifetime_ms: int = 0, close: bool = False):
        self.error = error
        self.message = message
        self.token = token
        self.session_lifetime_ms = session_lifetime_ms
        self.close = close


class AuthenticationFailed(Exception):
    """`str(exc)` is what the client is told; `reason` goes to the log."""

    def __init__(self, client_message: str, reason: str):
        super().__init__(client_message)
        self.reason = reason


class SaslAuthenticator:
    def __init__(self, node, connection) -> None:
        config = node.config
        self.node = node
        self.connection = connection
        self.mechanisms = enabled_mechanisms(config.sasl_enabled_mechanisms)
        self.reauth_ms = config.connections_max_reauth_ms
        self.failure_delay = config.connection_failed_authentication_delay_ms / 1000
        self.state = State.HANDSHAKE
        self.mechanism: str | None = None
        self._scram: scram.ScramServer | None = None
        self.reauthenticating = False
        self.session_expires_at: float | None = None  # trio time
        self.authentications = 0  # successful ones on this connection, re-authentications too

    # -- which requests may arrive now ---------------------------------------------------------

    def refusal(self, api_key: int) -> str | None:
        """Why a request of `api_key` closes the connection now, or None to serve it."""
        if self.state is State.AUTHENTICATED:
            if self.reauthenticating:
                return None
            if (self.session_expires_at is not None
                    and trio.current_time() >= self.session_expires_at
                    and api_key != ApiKey.SASL_HANDSHAKE):
                return "its SASL session expired and it did not re-authenticate (KIP-368)"
            if api_key == ApiKey.SASL_HANDSHAKE and self.session_expires_at is not None and (
                    trio.current_time() >= self.session_expires_at):
                return "its SASL session expired before it re-authenticated (KIP-368)"
            return None
        if self.state is State.HANDSHAKE:
            if api_key in (ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE):
                return None
        elif self.state is State.AUTHENTICATE:
            if api_key == ApiKey.SASL_AUTHENTICATE:
                return None
        elif self.state is State.FAILED:
            return "its authentication failed"
        return (f"unexpected request {_api_name(api_key)} during SASL "
                f"{self.state.value} (not authenticated)")

    # -- SaslHandshake -------------------------------------------------------------------------

    def handshake(self, mechanism: str) -> tuple[ErrorCode, bool]:
        """(error, close after the response)."""
        if self.state is State.AUTHENTICATED:
            # KIP-368: a re-authentication starts with a handshake for the same mechanism
            if mechanism != self.mechanism:
                self.state = State.FAILED
                log.info("failed re-authentication with %s (mechanism changed from %s to %s)",
                         self.connection.peer, self.mechanism, mechanism)
                return ErrorCode.illegal_sasl_state, True
            self.reauthenticating = True
            self._start(mechanism)
            return ErrorCode.none, False
        if self.state is not State.HANDSHAKE:
            return ErrorCode.illegal_sasl_state, True
        if mechanism not in self.mechanisms:
            self.state = State.FAILED
            self.node.metrics.authentication(self.connection.listener_name or "",
                                             mechanism[:32], "failure")
            log.info("failed authentication with %s (unsupported SASL mechanism %s)",
                     self.connection.peer, mechanism)
            return ErrorCode.unsupported_sasl_mechanism, True
        self.mechanism = mechanism
        self._start(mechanism)
        self.state = State.AUTHENTICATE
        return ErrorCode.none, False

    def _start(self, mechanism: str) -> None:
        self._scram = (scram.ScramServer(scram.MECHANISMS[mechanism])
                       if mechanism in scram.MECHANISMS else None)

    # -- SaslAuthenticate ----------------------------------------------------------------------

    async def authenticate(self, token: bytes) -> Outcome:
        if not (self.state is State.AUTHENTICATE or self.reauthenticating):
            return Outcome(ErrorCode.illegal_sasl_state,
                           "SaslAuthenticate without a SaslHandshake before it", close=True)
        try:
            if self._scram is None:
                user = await self._plain(token)
                return self._succeeded(user, b"")
            if self._scram.username is None:
                user = self._scram.parse_client_first(token)
                credential = await self._credential(self._scram.mechanism, user)
                if credential is None:
                    raise AuthenticationFailed(self._scram_failure(),
                                               f"unknown user {user!r}")
                return Outcome(token=self._scram.server_first(credential))
            user = self._scram.username
            try:
                final = self._scram.client_final(token)
            except scram.ScramError as exc:
                raise AuthenticationFailed(self._scram_failure(), f"user {user!r}: {exc}") \
                    from None
            return self._succeeded(user, final)
        except scram.ScramError as exc:
            return await self._failed(AuthenticationFailed(self._scram_failure(), str(exc)))
        except AuthenticationFailed as exc:
            return await self._failed(exc)

    def _scram_failure(self) -> str:
        return ("Authentication failed during authentication due to invalid credentials "
                f"with SASL mechanism {self.mechanism}")

    async def _plain(self, token: bytes) -> str:
        failure = "Authentication failed: Invalid username or password"
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: expected 3 tokens",
                                       "malformed PLAIN message")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed(failure, "PLAIN message is not UTF-8") from None
        if not user or not password:
            raise AuthenticationFailed(failure, "empty user name or password")
        if authzid and authzid != user:
            raise AuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is "
                "different from username", f"user {user!r} asked for authzid {authzid!r}")
        reason = await verify_password(self.node.metadata, user, password)
        if reason is not None:
            raise AuthenticationFailed(failure, reason)
        return user

    async def _credential(self, mechanism: scram.ScramMechanism,
                          user: str) -> scram.ScramCredential | None:
        return await stored_credential(self.node.metadata, mechanism, user)

    def _succeeded(self, user: str, token: bytes) -> Outcome:
        principal = KafkaPrincipal(USER_TYPE, user)
        if self.reauthenticating and principal != self.connection.principal:
            return self._fail_now(
                "Cannot change principals during re-authentication from "
                f"{self.connection.principal}: {principal}",
                f"re-authentication as {principal} instead of {self.connection.principal}")
        self.connection.principal = principal
        self.node.metrics.authentication(
            self.connection.listener_name or "", self.mechanism or "",
            "reauthentication" if self.reauthenticating else "success")
        if self.reauthenticating:
            log.debug("%s re-authenticated as %s", self.connection.peer, principal)
        self.state = State.AUTHENTICATED
        self.reauthenticating = False
        self._scram = None
        self.authentications += 1
        lifetime = 0
        if self.reauth_ms > 0:
            lifetime = self.reauth_ms
            self.session_expires_at = trio.current_time() + lifetime / 1000
        log.debug("%s authenticated as %s with %s", self.connection.peer, principal,
                  self.mechanism)
        return Outcome(token=token, session_lifetime_ms=lifetime)

    def _fail_now(self, message: str, reason: str) -> Outcome:
        self.state = State.FAILED
        self.node.metrics.authentication(self.connection.listener_name or "",
                                         self.mechanism or "", "failure")
        log.info("failed authentication with %s (%s)", self.connection.peer, reason)
        return Outcome(ErrorCode.sasl_authentication_failed, message, close=True)

    async def _failed(self, exc: AuthenticationFailed) -> Outcome:
        outcome = self._fail_now(str(exc), exc.reason)
        await trio.sleep(self.failure_delay)  # KIP-306
        return outcome


async def stored_credential(metadata, mechanism: scram.ScramMechanism,
                            user: str) -> scram.ScramCredential | None:
    from mink.storage.controlplane.security import credentials_of

    for _, name, salt, stored, server, iterations in await credentials_of(metadata, user):
        if name == mechanism.name:
            return scram.ScramCredential(salt, stored, server, iterations)
    return None


async def verify_password(metadata, user: str, password: str) -> str | None:
    """A user's password checked against their stored SCRAM credential (SHA-512 first),
    the salted password derived off the trio thread: None when it matches, else why not
    (for the log line; never for the client)."""
    for mechanism in (scram.SCRAM_SHA_512, scram.SCRAM_SHA_256):
        credential = await stored_credential(metadata, mechanism, user)
        if credential is None:
            continue
        salted = await trio.to_thread.run_sync(
            scram.salted_password, mechanism, password.encode(), credential.salt,
            credential.iterations)
        if scram.password_matches(mechanism, credential, salted):
            return None
        return f"wrong password for user {user!r}"
    return f"unknown user {user!r}"


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api {api_key}"


__all__ = ["PLAIN", "SUPPORTED", "SaslAuthenticator", "State", "enabled_mechanisms",
           "verify_password"]

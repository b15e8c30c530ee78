"""TLS for SSL and SASL_SSL listeners: the server context from PEM files, the handshake
through trio's SSLStream, and the principal of a client certificate (its subject DN mapped
by `ssl_principal_mapping_rules`, `ssl_principal.py`)."""

from __future__ import annotations

import ssl

import trio

from mink.broker.security.principal import ANONYMOUS, USER_TYPE, KafkaPrincipal
from mink.client import ClientSecurity
from mink.broker.security.ssl_principal import NoMatchingRule, subject_dn

HANDSHAKE_TIMEOUT = 10.0


class TlsRefused(Exception):
    pass


def server_context(config) -> ssl.SSLContext:
    """The node's TLS server context (TLS 1.2 or later), as ssl.client.auth says."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.ssl_cert_file, config.ssl_key_file,
                            password=config.ssl_key_password)
    if config.ssl_ca_file:
        context.load_verify_locations(cafile=config.ssl_ca_file)
    context.verify_mode = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                           "required": ssl.CERT_REQUIRED}[config.ssl_client_auth]
    return context


async def accept_tls(node, stream: trio.SocketStream, context: ssl.SSLContext,
                     peer: str) -> tuple[trio.SSLStream, KafkaPrincipal]:
    """The handshake, bounded; (the TLS stream, the certificate's principal or ANONYMOUS).
    TlsRefused (the stream closed) when it fails: a plaintext client, a bad or missing
    certificate, a DN no mapping rule matches."""
    tls = trio.SSLStream(stream, context, server_side=True)
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            await tls.do_handshake()
        cert = tls.getpeercert()
        principal = ANONYMOUS
        if cert and cert.get("subject"):
            mapper = node.principal_mapper
            principal = KafkaPrincipal(USER_TYPE, mapper.name(subject_dn(cert["subject"])))
        return tls, principal
    except (trio.BrokenResourceError, trio.TooSlowError, NoMatchingRule, ssl.SSLError) as exc:
        await trio.aclose_forcefully(tls)
        reason = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) and (
            exc.__cause__ is not None) else exc
        if isinstance(exc, trio.TooSlowError):
            reason = "no TLS handshake within %.0f s" % HANDSHAKE_TIMEOUT
        raise TlsRefused(f"SSL handshake failed: {reason}") from None
    except BaseException:
        await trio.aclose_forcefully(tls)
        raise


def inter_broker_security(config, listener) -> ClientSecurity | None:
    """How this node reaches the other nodes' inter-broker listener (`listener`, theirs is
    configured alike): None for PLAINTEXT; over TLS it trusts ssl_ca_file and shows its own
    certificate; over SASL it logs in as inter_broker_sasl_username."""
    if listener.protocol.value == "PLAINTEXT":
        return None
    return ClientSecurity(
        protocol=listener.protocol.value, mechanism=config.inter_broker_sasl_mechanism.upper(),
        username=config.inter_broker_sasl_username,
        password=config.inter_broker_sasl_password, ca_file=config.ssl_ca_file,
        cert_file=config.ssl_cert_file if listener.protocol.tls else None,
        key_file=config.ssl_key_file if listener.protocol.tls else None)

"""Envelope (API 58, KIP-590): a request another node forwarded, handled here as the
original client's, as Kafka's `handleEnvelope` and EnvelopeUtils do.

- Only on the inter-broker listener (Kafka: the privileged listener); on any other the
  connection is closed before this handler runs (`Connection._start_request`).
- Only from a principal with CLUSTER_ACTION on the cluster once the authorizer is on (super
  users pass), else CLUSTER_AUTHORIZATION_FAILED. Without an authorizer Kafka accepts
  anyone on that listener; Mink does too, except that on a SASL inter-broker listener it
  must be the inter-broker user, so an Envelope's quota exemption is a node's only.
- The principal (DefaultPrincipalData) and client address must decode:
  PRINCIPAL_DESERIALIZATION_FAILURE, INVALID_REQUEST. The request inside must be one that
  is forwarded (never an Envelope inside an Envelope): INVALID_REQUEST; and decode at a
  version this node serves: UNSUPPORTED_VERSION.
- The request inside is then handled by its own handler as the original principal from
  the original host: the handler checks its ACLs as for any client. It is never forwarded
  again, and not charged to a quota (nor is the Envelope). Its response, header and body,
  goes back in the EnvelopeResponse. A forwarded Produce with acks=0 has none: the
  EnvelopeResponse carries no data and no error (INVALID_REQUEST when it was refused, where
  a client's connection would have been closed).

Any refusal is one log line and an EnvelopeResponse with the error; the connection (another
node's) stays open.
"""

from __future__ import annotations

import logging

from kio.schema.envelope.v0 import EnvelopeResponse
from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import CLUSTER_ACTION
from mink.broker.security.principal import KafkaPrincipal
from mink.broker.server.errors import CloseConnection
from mink.protocol.apis import FORWARDABLE, ApiKey, advertised
from mink.protocol.envelope import MalformedEnvelope, address_text, deserialize_principal
from mink.protocol.messages import MalformedRequest, decode_request, encode_response, peek_header

log = logging.getLogger(__name__)


def _refused(error: ErrorCode) -> EnvelopeResponse:
    return EnvelopeResponse(response_data=None, error_code=error)


def may_send_envelopes(node, ctx) -> bool:
    """CLUSTER_ACTION on the cluster (super users pass); without an authorizer, on a SASL
    inter-broker listener, the inter-broker user."""
    if node.authorizer.enabled:
        return node.authorizer.cluster(ctx, CLUSTER_ACTION)
    connection = ctx.connection
    if connection.sasl is None:
        return True
    return ctx.principal.name == node.config.inter_broker_sasl_username


async def handle(node, ctx, request):
    if not may_send_envelopes(node, ctx):
        log.info("refused an envelope from %s: principal %s does not have CLUSTER_ACTION on "
                 "the cluster", ctx.peer, ctx.principal)
        return _refused(ErrorCode.cluster_authorization_failed)
    ctx.quota_exempt = True
    try:
        principal_type, name, _token = deserialize_principal(request.request_principal)
    except MalformedEnvelope as exc:
        log.warning("refused an envelope from %s: %s", ctx.peer, exc)
        return _refused(ErrorCode.principal_deserialization_failure)
    try:
        client_host = address_text(request.client_host_address)
    except MalformedEnvelope as exc:
        log.warning("refused an envelope from %s: %s", ctx.peer, exc)
        return _refused(ErrorCode.invalid_request)
    frame = bytes(request.request_data)
    try:
        api_key, api_version, _ = peek_header(frame)
    except MalformedRequest as exc:
        log.warning("refused an envelope from %s: %s", ctx.peer, exc)
        return _refused(ErrorCode.unsupported_version)
    if api_key not in FORWARDABLE:
        log.warning("refused an envelope from %s: api %d is not forwarded", ctx.peer, api_key)
        return _refused(ErrorCode.invalid_request)
    handler = ctx.connection.handlers.get(api_key)
    if handler is None or not advertised(api_key, api_version):
        log.warning("refused an envelope from %s: api %d v%d is not served", ctx.peer,
                    api_key, api_version)
        return _refused(ErrorCode.unsupported_version)
    try:
        inner = decode_request(frame)
    except MalformedRequest as exc:
        log.warning("refused an envelope from %s: %s", ctx.peer, exc)
        return _refused(ErrorCode.unsupported_version)
    inner_ctx = ctx.enveloped(inner, frame, KafkaPrincipal(principal_type, name), client_host)
    try:
        body = await handler(node, inner_ctx, inner.body)
    except CloseConnection as exc:
        if api_key == ApiKey.PRODUCE:  # an acks=0 Produce refused: the forwarder closes
            log.info("forwarded produce (acks=0) from %s refused: %s", ctx.peer, exc)
        else:
            log.warning("forwarded api %d from %s ended in a refusal: %s", api_key,
                        ctx.peer, exc)
        return _refused(ErrorCode.invalid_request)
    except Exception:
        log.exception("forwarded api %d v%d from %s failed", api_key, api_version, ctx.peer)
        return _refused(ErrorCode.unknown_server_error)
    if body is None:
        if api_key == ApiKey.PRODUCE:  # acks=0: no response, the batches were taken
            return EnvelopeResponse(response_data=None, error_code=ErrorCode.none)
        return _refused(ErrorCode.unknown_server_error)
    response = encode_response(inner.header.correlation_id, body)
    return EnvelopeResponse(response_data=response[4:], error_code=ErrorCode.none)

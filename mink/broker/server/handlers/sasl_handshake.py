"""SaslHandshake (API 17): the client names its mechanism (`mink/broker/security/sasl.py`).
On a listener without SASL it is ILLEGAL_SASL_STATE, as in Kafka. v0 (raw tokens after it)
is answered UNSUPPORTED_VERSION and the connection closed."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.protocol.messages import build, response_schema


async def handle(node, ctx, request):
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    sasl = ctx.connection.sasl
    if sasl is None:
        return build(schema, error_code=ErrorCode.illegal_sasl_state, mechanisms=())
    if ctx.header.api_version == 0:
        # v0 would be followed by raw SASL tokens outside Kafka's framing: not served
        ctx.close_after = True
        return build(schema, error_code=ErrorCode.unsupported_version,
                     mechanisms=sasl.mechanisms)
    error, close = sasl.handshake(request.mechanism)
    ctx.close_after = close
    return build(schema, error_code=error, mechanisms=sasl.mechanisms)

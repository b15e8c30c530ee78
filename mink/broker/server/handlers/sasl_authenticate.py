"""SaslAuthenticate (API 36): one step of the mechanism chosen by SaslHandshake
(`mink/broker/security/sasl.py`); v1+ tell the client its session lifetime (KIP-368)."""

from __future__ import annotations

import datetime
import logging

from kio.schema.errors import ErrorCode

from mink.broker.server.errors import CloseConnection
from mink.protocol.messages import build, response_schema

log = logging.getLogger(__name__)


async def handle(node, ctx, request):
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    sasl = ctx.connection.sasl
    if sasl is None:
        return build(schema, error_code=ErrorCode.illegal_sasl_state,
                     error_message="this listener does not use SASL", auth_bytes=b"",
                     session_lifetime=datetime.timedelta(0))
    try:
        outcome = await sasl.authenticate(bytes(request.auth_bytes))
    except (CloseConnection, ValueError):
        raise
    except Exception as exc:  # PostgreSQL unreachable: the client reconnects and retries
        raise CloseConnection(f"cannot authenticate now: {type(exc).__name__}: {exc}") from None
    ctx.close_after = outcome.close
    return build(schema, error_code=outcome.error, error_message=outcome.message,
                 auth_bytes=outcome.token,
                 session_lifetime=datetime.timedelta(milliseconds=outcome.session_lifetime_ms))

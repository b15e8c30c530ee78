"""ApiVersions: the APIs and version ranges this node serves."""

from __future__ import annotations

import datetime

from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.errors import ErrorCode

from mink.protocol.apis import ADVERTISED
from mink.protocol.messages import build, encode_response, nested, response_schema

NO_THROTTLE = datetime.timedelta(0)


def _ranges(entry_schema: type) -> tuple:
    return tuple(
        entry_schema(api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(ADVERTISED.items())
    )


async def handle(node, ctx, request):
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    return build(
        schema,
        error_code=ErrorCode.none,
        api_keys=_ranges(nested(schema, "ApiVersion")),
        throttle_time=NO_THROTTLE,
    )


def unsupported_version_response(correlation_id: int) -> bytes:
    """KIP-511: a request at a version we do not know is answered in v0 form."""
    body = ApiVersionsResponseV0(
        error_code=ErrorCode.unsupported_version, api_keys=_ranges(ApiVersionV0)
    )
    return encode_response(correlation_id, body)

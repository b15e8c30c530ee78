"""ApiVersions: the APIs and version ranges this node serves."""

from __future__ import annotations

import datetime

from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.errors import ErrorCode

from mink.protocol.apis import ADVERTISED, FINALIZED_FEATURES, SUPPORTED_FEATURES
from mink.protocol.messages import build, encode_response, nested, response_schema

NO_THROTTLE = datetime.timedelta(0)


def _ranges(entry_schema: type) -> tuple:
    return tuple(
        entry_schema(api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(ADVERTISED.items())
    )


def _features(schema, version: int) -> dict:
    if version < 3:
        return {}
    supported = nested(schema, "SupportedFeatureKey")
    finalized = nested(schema, "FinalizedFeatureKey")
    return dict(
        # Before v4 a feature whose range starts at 0 is left out, as Kafka does
        # (KAFKA-17011: older clients refuse a minimum of 0).
        supported_features=tuple(
            supported(name=name, min_version=low, max_version=high)
            for name, (low, high) in sorted(SUPPORTED_FEATURES.items())
            if version >= 4 or low > 0),
        finalized_features_epoch=-1 if not FINALIZED_FEATURES else 0,
        finalized_features=tuple(
            finalized(name=name, min_version_level=level, max_version_level=level)
            for name, level in sorted(FINALIZED_FEATURES.items())),
    )


async def handle(node, ctx, request):
    version = ctx.header.api_version
    schema = response_schema(ctx.header.api_key, version)
    return build(
        schema,
        error_code=ErrorCode.none,
        api_keys=_ranges(nested(schema, "ApiVersion")),
        throttle_time=NO_THROTTLE,
        **_features(schema, version),
    )


def unsupported_version_response(correlation_id: int) -> bytes:
    """KIP-511: a request at a version we do not know is answered in v0 form."""
    body = ApiVersionsResponseV0(
        error_code=ErrorCode.unsupported_version, api_keys=_ranges(ApiVersionV0)
    )
    return encode_response(correlation_id, body)

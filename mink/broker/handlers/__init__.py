"""One handler per Kafka API: `async def handle(node, ctx, request) -> response | None`."""

from mink.protocol.apis import ADVERTISED, ApiKey

from . import api_versions, metadata

HANDLERS = {
    ApiKey.API_VERSIONS: api_versions.handle,
    ApiKey.METADATA: metadata.handle,
}

# A client must never be offered an API that then fails.
assert set(HANDLERS) == set(ADVERTISED), set(HANDLERS) ^ set(ADVERTISED)

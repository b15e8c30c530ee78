"""One handler per Kafka API: `async def handle(node, ctx, request) -> response | None`."""

from mink.protocol.apis import ADVERTISED, ApiKey

from . import api_versions, fetch, list_offsets, metadata, offset_for_leader_epoch, produce

HANDLERS = {
    ApiKey.API_VERSIONS: api_versions.handle,
    ApiKey.METADATA: metadata.handle,
    ApiKey.PRODUCE: produce.handle,
    ApiKey.FETCH: fetch.handle,
    ApiKey.LIST_OFFSETS: list_offsets.handle,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: offset_for_leader_epoch.handle,
}

# A client must never be offered an API that then fails.
assert set(HANDLERS) == set(ADVERTISED), set(HANDLERS) ^ set(ADVERTISED)

"""AlterClientQuotas (API 49, KIP-546): set or remove quotas of user, client-id and
(user, client-id) entities, defaults included.

Each entry is validated as Kafka's ClientQuotaControlManager does (INVALID_REQUEST with
Kafka's messages: unknown entity type, duplicate or empty entity, unknown key, a value not
above 0 or fractional for a byte rate, a key twice in one entry); the valid entries are
stored in one transaction (`mink_alter_client_quotas`, sql/0015_quotas.sql) whose
change-log row makes every node read the quotas again. `validate_only` stores nothing.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.quotas.entities import InvalidQuota, check_value, parse_entity
from mink.broker.security.authorizer import ALTER_CONFIGS
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema
from mink.storage.controlplane import MetadataUnavailable


async def handle(node, ctx, request):
    # applied when it ends: the connection's next request sees the change (as in Kafka)
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    entry_schema = nested(schema, "EntryData")
    entity_schema = nested(schema, "EntityData")
    results: list[tuple[ErrorCode, str | None, tuple]] = []
    ops = []
    stored_at: list[int] = []  # indexes of results whose ops were stored
    authorized = node.authorizer.cluster(ctx, ALTER_CONFIGS)
    for entry in request.entries:
        entity = tuple(entity_schema(entity_type=e.entity_type, entity_name=e.entity_name)
                       for e in entry.entity)
        if not authorized:
            results.append((ErrorCode.cluster_authorization_failed,
                            "Cluster authorization failed.", entity))
            continue
        try:
            parsed = parse_entity((e.entity_type, e.entity_name) for e in entry.entity)
            seen: set[str] = set()
            entry_ops = []
            for op in entry.ops:
                if op.key in seen:
                    raise InvalidQuota(f"Duplicate quota key {op.key} not updating quota for "
                                       f"this entity")
                seen.add(op.key)
                if not op.remove:
                    check_value(op.key, float(op.value))
                entry_ops.append((parsed[0], parsed[1], op.key, float(op.value),
                                  bool(op.remove)))
        except InvalidQuota as exc:
            results.append((exc.code, str(exc), entity))
            continue
        ops.extend(entry_ops)
        stored_at.append(len(results))
        results.append((ErrorCode.none, None, entity))
    if ops and not request.validate_only:
        try:
            await node.quotas.alter(ops)
        except MetadataUnavailable as exc:  # nothing was stored (one transaction)
            for index in stored_at:
                results[index] = (ErrorCode.request_timed_out,
                                  f"the metadata store is unavailable: {exc}",
                                  results[index][2])
    return build(schema, throttle_time=NO_THROTTLE, entries=tuple(
        entry_schema(error_code=code, error_message=message, entity=entity)
        for code, message, entity in results))

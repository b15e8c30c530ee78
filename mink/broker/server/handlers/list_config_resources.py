"""ListConfigResources (API 74; v0 was ListClientMetricsResources, KIP-714; v1 KIP-1142,
Kafka 4.1): the resources that have configs, for admin clients' list_config_resources and
`kafka-configs --list`.

As Kafka answers it: DESCRIBE_CONFIGS on the cluster or CLUSTER_AUTHORIZATION_FAILED; no
types asked for means every type listed; a type not listed is UNSUPPORTED_VERSION. Listed:
every topic, every live broker, every group with dynamic configs of its own (Kafka lists
the groups its group config manager knows, not every group) and the client metrics
resources, of which Mink has none (it takes no client telemetry, KIP-714). Broker loggers
are not listed: Mink does not describe them.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import DESCRIBE_CONFIGS
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema

TOPIC, BROKER, CLIENT_METRICS, GROUP = 2, 4, 16, 32
LISTED = (TOPIC, BROKER, CLIENT_METRICS, GROUP)


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    entry = nested(schema, "ConfigResource")
    v0 = ctx.header.api_version == 0  # ListClientMetricsResources: names only

    def answer(error: ErrorCode, resources=()):
        return build(schema, throttle_time=NO_THROTTLE, error_code=error, config_resources=tuple(
            build(entry, resource_name=name) if v0
            else build(entry, resource_name=name, resource_type=kind)
            for kind, name in resources))

    if not node.authorizer.cluster(ctx, DESCRIBE_CONFIGS):
        return answer(ErrorCode.cluster_authorization_failed)
    asked = (CLIENT_METRICS,) if v0 else tuple(request.resource_types) or LISTED
    if any(kind not in LISTED for kind in asked):
        return answer(ErrorCode.unsupported_version)
    view = node.view
    listed: list[tuple[int, str]] = []
    if GROUP in asked:
        listed += [(GROUP, name) for kind, name in sorted(node.dynamic_configs.stored)
                   if kind == GROUP]
    if BROKER in asked:
        listed += [(BROKER, str(node_id)) for node_id in sorted(view.brokers)]
    if TOPIC in asked:
        listed += [(TOPIC, name) for name in sorted(view.topics)]
    return answer(ErrorCode.none, listed)

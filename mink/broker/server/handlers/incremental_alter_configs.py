"""IncrementalAlterConfigs (API 44): SET, DELETE, APPEND, SUBTRACT on a topic's settings or
on a broker's or a group's dynamic configs. The changes themselves are
`mink/broker/topics/changes.py` and `mink/broker/dynamic_configs.py`."""

from __future__ import annotations

from mink.broker.dynamic_configs import DYNAMIC, altered_config, validator
from mink.broker.security.authorizer import ALTER_CONFIGS
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.topics.changes import TOPIC, change_topic_config, refuse_non_topic
from mink.broker.topics.config import InvalidConfig, altered_topic_config
from mink.protocol.messages import build, nested, response_schema

# Kafka's AlterConfigOp.OpType.
OPERATIONS = {0: "SET", 1: "DELETE", 2: "APPEND", 3: "SUBTRACT"}


async def handle(node, ctx, request):
    # applied when it ends: the connection's next request sees the change (as in Kafka)
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    result_schema = nested(schema, "AlterConfigsResourceResponse")
    results = []
    for resource in request.resources:
        refused = node.authorizer.config_refusal(ctx, ALTER_CONFIGS, resource.resource_type,
                                                 resource.resource_name)
        if refused:
            error, message = refused
        elif resource.resource_type in DYNAMIC:
            changes = [(OPERATIONS.get(c.config_operation), c.name, c.value)
                       for c in resource.configs]
            validate = validator(resource.resource_type, node.config)
            error, message = await node.dynamic_configs.change(
                resource.resource_type, resource.resource_name,
                lambda current, c=changes, v=validate: altered_config(current, c, v),
                bool(request.validate_only))
        elif resource.resource_type != TOPIC:
            error, message = refuse_non_topic(resource.resource_type, resource.resource_name)
        else:
            changes = [(OPERATIONS.get(c.config_operation), c.name, c.value)
                       for c in resource.configs]

            def compute(current, changes=changes):
                for op, name, _ in changes:
                    if op is None:
                        raise InvalidConfig(f"unknown config operation for {name!r}")
                return altered_topic_config(current, changes)

            error, message = await change_topic_config(
                node, resource.resource_name, compute, bool(request.validate_only))
        results.append(result_schema(error_code=error, error_message=message,
                                     resource_type=resource.resource_type,
                                     resource_name=resource.resource_name))
    return build(schema, throttle_time=NO_THROTTLE, responses=tuple(results))

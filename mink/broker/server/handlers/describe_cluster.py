"""DescribeCluster: the live brokers, the controller (the coordinator lease holder) and the
cluster id. Every Mink node is a broker; none is a KRaft controller endpoint."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.security.operations import OMITTED
from mink.protocol.messages import build, nested, response_schema

BROKERS, CONTROLLERS = 1, 2  # Kafka's EndpointType


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    endpoint_type = getattr(request, "endpoint_type", BROKERS)
    if endpoint_type != BROKERS:
        if endpoint_type == CONTROLLERS:
            error, message = (ErrorCode.mismatched_endpoint_type,
                              "The request was sent to an endpoint of type BROKER, but we "
                              "wanted an endpoint of type CONTROLLER")
        else:
            error, message = (ErrorCode.unsupported_endpoint_type,
                              f"Endpoint type {endpoint_type} is not supported")
        return build(schema, throttle_time=NO_THROTTLE, error_code=error,
                     error_message=message, endpoint_type=BROKERS, cluster_id="",
                     controller_id=-1, brokers=(),
                     cluster_authorized_operations=OMITTED)
    view = node.view
    broker_schema = nested(schema, "DescribeClusterBroker")
    return build(
        schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, error_message=None,
        endpoint_type=BROKERS, cluster_id=view.cluster_id, controller_id=view.controller_id,
        # v2 (KIP-1073) may ask for fenced brokers too: a Mink node is live or absent,
        # so every broker listed is unfenced
        brokers=tuple(build(broker_schema, broker_id=b.node_id,
                            host=b.endpoint(ctx.listener_name)[0],
                            port=b.endpoint(ctx.listener_name)[1], rack=b.rack,
                            is_fenced=False)
                      for b in sorted(view.brokers.values(), key=lambda b: b.node_id)),
        cluster_authorized_operations=node.authorizer.cluster_operations(
            ctx, bool(request.include_cluster_authorized_operations)))

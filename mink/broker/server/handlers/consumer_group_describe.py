"""ConsumerGroupDescribe (KIP-848): a consumer group's epochs, assignor and members with
their current and target assignments."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.groups.consumer_coordinator import DescribedGroup, describe
from mink.broker.security.operations import OMITTED
from mink.broker.security.authorizer import DESCRIBE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema

CONSUMER_MEMBER = 1  # member_type (v1): a member using the consumer protocol


async def handle(node, ctx, request):
    ctx.applied()
    version = ctx.header.api_version
    schema = response_schema(ctx.header.api_key, version)
    group_schema = nested(schema, "DescribedGroup")
    member_schema = nested(schema, "Member")
    assignment_schema = nested(schema, "Assignment")
    tp_schema = nested(schema, "TopicPartitions")
    asked = bool(request.include_authorized_operations)

    def assignment(partitions):
        return build(assignment_schema, topic_partitions=tuple(
            build(tp_schema, topic_id=topic_id, topic_name=name, partitions=tuple(ps))
            for topic_id, name, ps in partitions))

    groups = []
    for group_id in request.group_ids:
        d = describe(node.groups.consumer, group_id) if node.authorizer.group(
            ctx, DESCRIBE, group_id) else DescribedGroup(
            group_id, ErrorCode.group_authorization_failed)
        extra = {"member_type": CONSUMER_MEMBER} if version >= 1 else {}
        groups.append(build(
            group_schema, error_code=d.error, error_message=d.message, group_id=group_id,
            group_state=d.state, group_epoch=d.group_epoch,
            assignment_epoch=d.assignment_epoch, assignor_name=d.assignor_name,
            authorized_operations=node.authorizer.group_operations(ctx, group_id, asked)
            if d.members is not None else OMITTED,
            members=tuple(build(
                member_schema, member_id=m.member_id, instance_id=m.instance_id,
                rack_id=m.rack_id, member_epoch=m.member_epoch, client_id=m.client_id,
                client_host=m.client_host, subscribed_topic_names=m.subscribed_topic_names,
                subscribed_topic_regex=m.subscribed_topic_regex, assignment=assignment(m.assignment),
                target_assignment=assignment(m.target_assignment), **extra)
                for m in d.members or ())))
    return build(schema, throttle_time=NO_THROTTLE, groups=tuple(groups))

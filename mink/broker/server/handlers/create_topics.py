"""CreateTopics: check each topic the way Kafka's controller does, then create it and wait
until this node's view has it, so the client's next Metadata request finds it.

Each partition has one copy (its leader), made durable by the object store: the replication
factor is 1 (or -1, the default), and a manual assignment names exactly one live broker per
partition, which becomes its leader.
"""

from __future__ import annotations

import dataclasses

import logging
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from mink.broker.server.forwarding import forward_unless_coordinator
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.server.handlers.describe_configs import topic_config_entries
from mink.broker.topics.admin import NotClusterCoordinator
from mink.broker.topics.config import TOPIC_SETTINGS, InvalidConfig, validate_topic_config
from mink.protocol.messages import build, nested, response_schema
from mink.protocol.topics import topic_name_error
from mink.storage import controlplane as md

log = logging.getLogger(__name__)

ZERO_UUID = uuid.UUID(int=0)
# Kafka's controller refuses a request that would create more partitions than this at once.
MAX_PARTITIONS_PER_REQUEST = 10_000


class Refused(Exception):
    """A topic (or partition) request Kafka would refuse: the error code and its message."""

    def __init__(self, error: ErrorCode, message: str):
        super().__init__(message)
        self.error = error
        self.message = message


@dataclass(frozen=True, slots=True)
class Plan:
    name: str
    partitions: int
    leaders: list[int] | None  # from a manual assignment; None: the node spreads them
    configs: dict[str, str]


async def handle(node, ctx, request):
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    # Forwarded as it came; the coordinator checks it, as the original principal
    forwarded = await forward_unless_coordinator(node, ctx) if request.topics else None
    if forwarded is not None:
        return forwarded
    # CREATE on the cluster or the topic
    denied = {t.name: _refused(schema, t.name, Refused(
        ErrorCode.topic_authorization_failed, "Authorization failed."))
        for t in request.topics if not node.authorizer.may_create_topic(ctx, t.name)}
    if denied:
        request = dataclasses.replace(request, topics=tuple(
            t for t in request.topics if t.name not in denied))
    results: dict[str, object] = dict(denied)
    counts = Counter(t.name for t in request.topics)
    total = sum(_requested_partitions(node, t) for t in request.topics)
    created: list[str] = []  # by this request: the view shows them after the loop
    for topic in request.topics:
        name = topic.name
        if name in results:
            continue
        try:
            if total > MAX_PARTITIONS_PER_REQUEST:
                raise Refused(ErrorCode.policy_violation,
                              "Excessively large number of partitions per request.")
            if counts[name] > 1:
                raise Refused(ErrorCode.invalid_request, "Duplicate topic name.")
            plan = plan_topic(node, topic, created)
            topic_id = ZERO_UUID
            if not request.validate_only:
                topic_id = await create_topic(node, plan)
                created.append(name)
            results[name] = _created(schema, plan, topic_id, node.config,
                                     node.dynamic_configs.layers())
        except Refused as refused:
            results[name] = _refused(schema, name, refused)
    if created:  # one view refresh for the request, not one per topic
        await node.topic_admin.refresh_after_actions()
    ctx.applied()
    return build(schema, throttle_time=NO_THROTTLE, topics=tuple(results.values()))


def _requested_partitions(node, topic) -> int:
    if topic.assignments:
        return len(topic.assignments)
    if topic.num_partitions == -1:
        return node.config.num_partitions
    return max(topic.num_partitions, 0)


def plan_topic(node, topic, created: Sequence[str] = ()) -> Plan:
    """What creating `topic` means, or Refused; in Kafka's order: name, existence, configs,
    then the assignment, replication factor and partition count. `created`: topics the
    same request created before it, not yet in the view."""
    name = topic.name
    problem = topic_name_error(name)
    if problem:
        raise Refused(ErrorCode.invalid_topic_exception, problem)
    view = node.view
    if name in view.topics or name in created:
        raise Refused(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
    collision = _colliding_topic(name, [*view.topics, *created] if created else view.topics)
    if collision:
        raise Refused(ErrorCode.invalid_topic_exception,
                      f"Topic '{name}' collides with existing topic: {collision}")
    configs = checked_configs({c.name: c.value for c in topic.configs})

    if topic.assignments:
        if topic.replication_factor != -1:
            raise Refused(ErrorCode.invalid_request, "A manual partition assignment was "
                          "specified, but replication factor was not set to -1.")
        if topic.num_partitions != -1:
            raise Refused(ErrorCode.invalid_request, "A manual partition assignment was "
                          "specified, but numPartitions was not set to -1.")
        by_index: dict[int, int] = {}
        for assignment in topic.assignments:
            index = assignment.partition_index
            if index in by_index:
                raise Refused(ErrorCode.invalid_replica_assignment,
                              f"Found multiple manual partition assignments for partition {index}")
            by_index[index] = assigned_leader(node, index, assignment.broker_ids)
        if len({len(a.broker_ids or ()) for a in topic.assignments}) > 1:
            raise Refused(ErrorCode.invalid_replica_assignment,
                          "All partitions should have the same number of replicas.")
        if sorted(by_index) != list(range(len(by_index))):
            raise Refused(ErrorCode.invalid_replica_assignment,
                          "partitions should be a consecutive 0-based integer sequence")
        return Plan(name, len(by_index), [by_index[i] for i in range(len(by_index))], configs)

    check_replication_factor(node, topic.replication_factor)
    partitions = topic.num_partitions
    if partitions == -1:
        partitions = node.config.num_partitions
    elif partitions <= 0:
        raise Refused(ErrorCode.invalid_partitions,
                      "Number of partitions was set to an invalid non-positive value.")
    return Plan(name, partitions, None, configs)


def check_replication_factor(node, replication_factor: int) -> None:
    """Kafka's checks. A factor up to the registered brokers is taken, as Kafka takes it,
    and means what any factor means here: one copy, its leader's, made durable by the
    object store (tools and frameworks ask for 3 by default on a cluster of three)."""
    if replication_factor == 0 or replication_factor < -1:
        raise Refused(ErrorCode.invalid_replication_factor,
                      "Replication factor must be larger than 0, or -1 to use the default value.")
    registered = len(node.view.brokers)
    if replication_factor > max(registered, 1):
        raise Refused(ErrorCode.invalid_replication_factor,
                      f"Unable to replicate the partition {replication_factor} time(s): The "
                      f"target replication factor of {replication_factor} cannot be reached "
                      f"because only {registered} broker(s) are registered.")


def assigned_leader(node, index: int, broker_ids) -> int:
    """The leader a manual assignment names: its first broker (Kafka's preferred leader).
    The brokers must be distinct and registered, as in Kafka; the others hold no copy (one
    copy, the leader's, made durable by the object store: see check_replication_factor)."""
    brokers = list(broker_ids or ())
    if not brokers:
        raise Refused(ErrorCode.invalid_replica_assignment,
                      f"The manual partition assignment for partition {index} is empty.")
    if len(set(brokers)) != len(brokers):
        raise Refused(ErrorCode.invalid_replica_assignment,
                      f"The manual partition assignment for partition {index} contains "
                      f"duplicate broker IDs: {brokers}")
    unknown = [b for b in brokers if b not in node.view.brokers]
    if unknown:
        raise Refused(ErrorCode.invalid_replica_assignment,
                      f"The manual partition assignment includes broker(s) {unknown}, but no "
                      "such broker is registered.")
    return brokers[0]


def checked_configs(configs: dict[str, str | None]) -> dict[str, str]:
    """The topic configs as stored, or Refused(INVALID_CONFIG) naming the bad one."""
    for key, value in configs.items():
        try:
            validate_topic_config({key: value})
        except InvalidConfig as exc:
            if key in TOPIC_SETTINGS and value is not None:
                raise Refused(ErrorCode.invalid_config,
                              f"Invalid value {value} for configuration {key}: {exc}") from None
            raise Refused(ErrorCode.invalid_config, str(exc)) from None
    return validate_topic_config(configs)


def _colliding_topic(name: str, topics) -> str | None:
    """Kafka refuses names that differ from an existing one only by '.' versus '_'."""
    if "." not in name and "_" not in name:
        return None
    unified = name.replace(".", "_")
    for other in topics:
        if other != name and other.replace(".", "_") == unified:
            return other
    return None


async def create_topic(node, plan: Plan) -> uuid.UUID:
    """Create the topic (the caller refreshes the view after); Refused on a known
    refusal."""
    try:
        created = await node.topic_admin.create_topic(plan.name, plan.partitions,
                                                      plan.configs, plan.leaders,
                                                      refresh=False)
    except NotClusterCoordinator as exc:
        raise Refused(ErrorCode.not_controller, str(exc)) from None
    except md.TopicExists:
        raise Refused(ErrorCode.topic_already_exists,
                      f"Topic '{plan.name}' already exists.") from None
    except md.InvalidPartitions as exc:
        raise Refused(ErrorCode.invalid_partitions, str(exc)) from None
    except InvalidConfig as exc:
        raise Refused(ErrorCode.invalid_config, str(exc)) from None
    except md.MetadataUnavailable as exc:
        # Retriable; the topic may or may not exist now (a retry then finds it).
        raise Refused(ErrorCode.request_timed_out,
                      f"the metadata store did not answer, try again: {exc}") from None
    except md.MetadataError as exc:
        raise Refused(ErrorCode.unknown_server_error, str(exc)) from None
    log.info("created topic %s with %d partitions%s", plan.name, plan.partitions,
             f" and configs {plan.configs}" if plan.configs else "")
    return created.topic_id


def _created(schema, plan: Plan, topic_id: uuid.UUID, broker_config=None, dynamic=()):
    configs = ()
    if schema.__version__ >= 5:  # the resulting configs are part of the answer from v5
        config_schema = nested(schema, "CreatableTopicConfigs")
        configs = tuple(
            config_schema(name=e.name, value=e.value, read_only=e.read_only,
                          config_source=e.source, is_sensitive=False)
            for e in topic_config_entries(plan.configs, broker_config, dynamic))
    return build(nested(schema, "CreatableTopicResult"), name=plan.name, topic_id=topic_id,
                 error_code=ErrorCode.none, error_message=None,
                 num_partitions=plan.partitions, replication_factor=1, configs=configs)


def _refused(schema, name: str, refused: Refused):
    return build(nested(schema, "CreatableTopicResult"), name=name, topic_id=ZERO_UUID,
                 error_code=refused.error, error_message=refused.message,
                 num_partitions=-1, replication_factor=-1, configs=())

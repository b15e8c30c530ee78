"""Finding the partition a request names, and the errors Kafka answers when it is not here."""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from mink.broker.cluster.view import PartitionInfo, TopicInfo
from mink.storage.log import PartitionLog


@dataclass(slots=True)
class Located:
    error: ErrorCode
    topic: TopicInfo | None = None
    partition: PartitionInfo | None = None
    log: PartitionLog | None = None


def locate(node, name: str, index: int, *, still_opening: ErrorCode =
           ErrorCode.not_leader_or_follower) -> Located:
    """The open log for (topic, partition) on this node, or the error to answer.

    `still_opening` is what a partition this node leads but has not opened yet gets:
    NOT_LEADER_OR_FOLLOWER for Produce and Fetch (the Java consumer throws on
    LEADER_NOT_AVAILABLE in a Fetch), LEADER_NOT_AVAILABLE for ListOffsets.
    """
    topic = node.view.topics.get(name)
    if topic is None or not 0 <= index < len(topic.partitions):
        return Located(ErrorCode.unknown_topic_or_partition)
    partition = topic.partitions[index]
    partition_log = node.leader_log(topic, index)
    if partition_log is not None:
        return Located(ErrorCode.none, topic, partition, partition_log)
    if partition.leader == node.node_id:
        return Located(still_opening, topic, partition)
    if partition.leader is None or partition.leader not in node.view.brokers:
        return Located(ErrorCode.leader_not_available if still_opening ==
                       ErrorCode.leader_not_available else ErrorCode.not_leader_or_follower,
                       topic, partition)
    return Located(ErrorCode.not_leader_or_follower, topic, partition)


async def locate_for_reading(node, name: str, index: int, *,
                             still_opening: ErrorCode = ErrorCode.not_leader_or_follower,
                             max_age: float = 0.0) -> Located:
    """As `locate`, but a partition another node leads is located at this node's replica view
    of it (mink/broker/server/replica_reads.py), its ends read from PostgreSQL no longer
    than `max_age` seconds ago: what a consumer's ListOffsets and OffsetForLeaderEpoch are
    answered from on any node. NOT_LEADER_OR_FOLLOWER when there is no view to be had."""
    located = locate(node, name, index, still_opening=still_opening)
    if located.error != ErrorCode.not_leader_or_follower or located.partition is None or (
            located.partition.leader == node.node_id):
        return located
    key = (located.topic.topic_id, index)
    view = (await node.replica_reads.views_for([key], max_age=max_age)).get(key)
    if view is None:
        return located
    return Located(ErrorCode.none, located.topic, located.partition, view)


def check_leader_epoch(current_leader_epoch: int, partition_log: PartitionLog) -> ErrorCode:
    """KIP-320: a client that knows a newer epoch than ours talks to a stale leader; one that
    knows an older epoch must refresh its metadata. -1 means the client does not say."""
    if current_leader_epoch < 0 or current_leader_epoch == partition_log.leader_epoch:
        return ErrorCode.none
    if current_leader_epoch < partition_log.leader_epoch:
        return ErrorCode.fenced_leader_epoch
    return ErrorCode.unknown_leader_epoch

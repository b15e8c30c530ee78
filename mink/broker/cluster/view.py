"""The node's view of the cluster: an immutable snapshot of the control-plane state in
PostgreSQL, replaced whole by the sync task whenever the change log moves. Handlers read
one snapshot per request, so they never see half of a change."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None
    epoch: int = 0
    # Its advertised listeners: (name, host, port). Clients are answered with the endpoint
    # of the listener their request came in on (`endpoint`).
    endpoints: tuple[tuple[str, str, int], ...] = ()
    # Draining (a clean stop, or `mink cluster drain`): live, still listed and still leading
    # what has not moved yet, but given no new partitions (sql/0027).
    draining: bool = False

    def endpoint(self, listener: str | None) -> tuple[str, int]:
        """(host, port) of this broker's advertised listener named `listener`; its
        inter-broker address when it has no such listener (a node started before listeners
        were stored, or configured differently)."""
        if listener is not None:
            for name, host, port in self.endpoints:
                if name == listener:
                    return host, port
        return self.host, self.port


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    index: int
    leader: int | None
    leader_epoch: int
    # The stream's state in PostgreSQL: who opened it last, at which epochs.
    stream_open: bool = False
    opened_by_node: int | None = None
    opened_by_epoch: int | None = None
    open_leader_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class TopicInfo:
    topic_id: uuid.UUID
    name: str
    partitions: tuple[PartitionInfo, ...]
    config: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClusterView:
    version: int
    cluster_id: str
    brokers: dict[int, BrokerInfo]
    topics: dict[str, TopicInfo]
    coordinator: int | None = None
    # The brokers Metadata lists: the live ones, plus those live within the listing grace
    # (`PartitionSync`): a node whose membership lapsed in a PostgreSQL blip is not dropped
    # from clients' broker lists, which makes librdkafka tear down its connection and
    # in-flight requests (and has left its producers stuck for good). Leaders are only
    # ever live brokers. Empty: the live ones.
    listed_brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    # Responses computed from this snapshot (encoded Metadata answers): they live and die
    # with it, so they are never stale.
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def controller_id(self) -> int:
        # Admin clients send to the controller: never answer -1 while any node is live, nor
        # while every node's membership lapsed together (PostgreSQL unreachable, a starved
        # machine): kafka-python's admin then raises instead of retrying. A listed broker
        # answers or forwards the request, or gives a retriable error.
        if self.coordinator is not None and self.coordinator in self.brokers:
            return self.coordinator
        return min(self.brokers or self.listed_brokers, default=-1)

    @property
    def assignable(self) -> list[int]:
        """The live nodes new work may go to (not draining), by id."""
        return sorted(b.node_id for b in self.brokers.values() if not b.draining)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        # Fetch v13+ names every topic by id: one dict per snapshot, not a scan per topic.
        by_id = self.memo.get("topics_by_id")
        if by_id is None:
            by_id = self.memo["topics_by_id"] = {t.topic_id: t for t in self.topics.values()}
        return by_id.get(topic_id)

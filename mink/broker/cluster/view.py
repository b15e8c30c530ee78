"""The node's view of the cluster: an immutable snapshot of the control-plane state in
PostgreSQL. Handlers read one snapshot per request, so they never see half of a change.

The sync task replaces it when the change log moves, by deltas (`with_changes`): a new
snapshot shares every topic that did not change with the one before, so a change costs what
changed, not what exists (issue 22). Stream states (who has a partition open) are not in
it: opening writes no change-log row, so the view could only show them stale; the sync reads
them from PostgreSQL for the partitions it opens."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field, replace


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


@dataclass(frozen=True, slots=True)
class TopicInfo:
    topic_id: uuid.UUID
    name: str
    partitions: tuple[PartitionInfo, ...]
    # The settings in force: the topic's own values over the topic defaults of the dynamic
    # broker configs that apply to this node (`with_defaults`). Readers use this one.
    config: dict = field(default_factory=dict)
    # The topic's own values, when defaults were folded into `config` (None: `config` is).
    own_config: dict | None = None

    @property
    def own(self) -> dict:
        """The values set on the topic itself (DescribeConfigs' DYNAMIC_TOPIC_CONFIG)."""
        return self.config if self.own_config is None else self.own_config

    def with_defaults(self, defaults: dict) -> TopicInfo:
        """This topic with `defaults` (topic setting -> value) under its own values."""
        own = self.own
        if not defaults:
            return self if self.own_config is None else replace(self, config=own,
                                                                 own_config=None)
        return replace(self, config={**defaults, **own}, own_config=own)


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
    # Indexes of the topics (by id; partitions per leader), carried over from the snapshot
    # before by `with_changes`, else built at first use.
    derived: dict = field(default_factory=dict, compare=False, repr=False)

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
        return self._by_id().get(topic_id)

    def _by_id(self) -> dict[uuid.UUID, TopicInfo]:
        by_id = self.derived.get("by_id")
        if by_id is None:
            by_id = self.derived["by_id"] = {t.topic_id: t for t in self.topics.values()}
        return by_id

    def partition(self, topic_id: uuid.UUID, index: int) -> PartitionInfo | None:
        topic = self._by_id().get(topic_id)
        if topic is None or not 0 <= index < len(topic.partitions):
            return None
        return topic.partitions[index]

    def leader_counts(self) -> Counter:
        """Partitions per leader node (None: no leader), so "does a dead or draining node
        still lead something" costs one look per node, not a scan of every partition."""
        counts = self.derived.get("leaders")
        if counts is None:
            counts = self.derived["leaders"] = Counter(
                p.leader for t in self.topics.values() for p in t.partitions)
        return counts

    def leads_any(self, node_id: int) -> bool:
        return self.leader_counts()[node_id] > 0

    def with_changes(self, version: int, brokers: dict[int, BrokerInfo],
                     coordinator: int | None, listed_brokers: dict[int, BrokerInfo],
                     changed: list[uuid.UUID], topics: list[TopicInfo]) -> ClusterView:
        """The next snapshot: the topics named in `changed` replaced by those of `topics`
        (a changed id absent from `topics` was deleted), every other topic shared with this
        one; the indexes updated for the changed topics only. Topics stay in name order."""
        by_id = dict(self._by_id())
        leaders = Counter(self.leader_counts())
        names = dict(self.topics)
        kept = {t.topic_id for t in topics}
        for topic_id in changed:
            old = by_id.pop(topic_id, None)
            if old is not None:
                if topic_id not in kept and names.get(old.name) is old:
                    del names[old.name]  # deleted (a changed topic keeps its place)
                leaders.subtract(p.leader for p in old.partitions)
        last = next(reversed(names), None)
        in_order = True
        for topic in topics:
            if topic.name not in names and last is not None and topic.name < last:
                in_order = False
            names[topic.name] = by_id[topic.topic_id] = topic
            leaders.update(p.leader for p in topic.partitions)
        if not in_order:
            names = dict(sorted(names.items()))
        derived = {"by_id": by_id, "leaders": +leaders}  # + drops zeros
        if "topic_bytes" in self.derived:  # encoded Metadata topics, checked by identity
            derived["topic_bytes"] = self.derived["topic_bytes"]
        return ClusterView(version=version, cluster_id=self.cluster_id, brokers=brokers,
                           topics=names, coordinator=coordinator,
                           listed_brokers=listed_brokers, derived=derived)

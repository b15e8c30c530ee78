"""A node's metrics, in Prometheus' text format through prometheus-client.

One `CollectorRegistry` per node, never the process-wide default: in-process clusters (the
tests, `mink.testing`) run several nodes in one process. Names follow Prometheus'
conventions and Kafka's broker metrics where Kafka has one (BrokerTopicMetrics' BytesInPerSec
is `mink_broker_topic_bytes_in_total{topic}`, RequestMetrics' TotalTimeMs is
`mink_request_latency_seconds{api,version}`, ReplicaManager's LeaderCount is
`mink_partitions_led`).

The hot path stays cheap: labelled children are looked up once and cached (a dict lookup per
request or per partition of a request, then one inc/observe), nothing is done per record,
and everything that is state rather than an event (partitions led, epochs, view version,
groups, lag, caches, connections) is read from the node only when /metrics is scraped.
Without an admin listener the node gets `NULL_METRICS`, whose methods do nothing.
"""

from __future__ import annotations

import uuid

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest

from mink.broker.admin import compaction_metrics
from mink.broker.groups.lag import ConsumerLag
from mink.protocol.apis import ApiKey
from mink.storage.objectstore.instrumented import InstrumentedObjectStore
from mink.storage.observer import NO_OBSERVER, StorageObserver

# Seconds: from a cached Metadata answer (tens of us) to a Produce waiting out a slow commit.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0, 30.0)
# Bytes of a WAL object: one small batch up to wal_max_bytes (8 MiB by default) and past it.
# Seconds of a quota throttle: a few ms up to the uncapped byte-rate throttles.
THROTTLE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Seconds of a compaction pass: a small partition's in tens of ms, a GiB's in minutes.
PASS_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
SIZE_BUCKETS = tuple(float(1 << n) for n in range(10, 26, 2))  # 1 KiB .. 16 MiB


def api_name(api_key: int) -> str:
    """Kafka's request name (ApiKeys' camel case: LIST_OFFSETS -> ListOffsets)."""
    try:
        return "".join(part.capitalize() for part in ApiKey(api_key).name.split("_"))
    except ValueError:
        return str(api_key)


class TopicMeters:
    """The four BrokerTopicMetrics children of one topic, looked up once."""

    __slots__ = ("bytes_in", "messages_in", "bytes_out", "messages_out")

    def __init__(self, bytes_in, messages_in, bytes_out, messages_out) -> None:
        self.bytes_in = bytes_in
        self.messages_in = messages_in
        self.bytes_out = bytes_out
        self.messages_out = messages_out


class _NoMeter:
    __slots__ = ()

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


_NO_METER = _NoMeter()
_NO_TOPIC = TopicMeters(_NO_METER, _NO_METER, _NO_METER, _NO_METER)


class NullMetrics:
    """Metrics off (no admin listener): the same methods, doing nothing."""

    enabled = False
    storage: StorageObserver = NO_OBSERVER
    lag = None

    def request(self, api_key: int, version: int):
        return _NO_METER

    def request_error(self, api_key: int, version: int, error: str) -> None:
        pass

    def topic(self, name: str) -> TopicMeters:
        return _NO_TOPIC

    def connection_opened(self) -> None:
        pass

    def connection_closed(self) -> None:
        pass

    def group_rebalance(self) -> None:
        pass

    def quota_throttled(self, quota: str, seconds: float) -> None:
        pass

    def authentication(self, listener: str, mechanism: str, result: str) -> None:
        pass

    def produce_forwarded(self, target: int, partitions: int) -> None:
        pass

    def produce_forward_error(self, target: int, error: str) -> None:
        pass

    def coordinator_forwarded(self, target: int, api_key: int) -> None:
        pass

    def coordinator_forward_error(self, target: int, api_key: int) -> None:
        pass

    def observe_object_store(self, store):
        return store

    def tiering_round(self) -> None:
        pass

    def tiering_swapped(self, size: int) -> None:
        pass

    def tiering_refused(self, reason: str) -> None:
        pass

    def compaction_pass(self, seconds: float) -> None:
        pass

    def exposition(self) -> bytes:
        return b""


NULL_METRICS = NullMetrics()


class NodeMetrics:
    """Metrics on: the registry of one node and its cached children."""

    enabled = True

    def __init__(self, node) -> None:
        self.node = node
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self._latency = Histogram(
            "mink_request_latency_seconds",
            "Time from a Kafka request's arrival to its response being ready, by API and "
            "version (Kafka's RequestMetrics TotalTimeMs; _count is the request count).",
            ["api", "version"], buckets=LATENCY_BUCKETS, registry=registry)
        self._errors = Counter(
            "mink_request_errors",
            "Kafka requests answered with an error, per error (a partition's error counts "
            "once per partition; a closed connection counts as CONNECTION_CLOSED).",
            ["api", "version", "error"], registry=registry)
        labels = ["topic"]
        self._bytes_in = Counter("mink_broker_topic_bytes_in",
                                 "Bytes of record batches appended, per topic (BytesInPerSec).",
                                 labels, registry=registry)
        self._messages_in = Counter("mink_broker_topic_messages_in",
                                    "Records appended, per topic (MessagesInPerSec).",
                                    labels, registry=registry)
        self._bytes_out = Counter("mink_broker_topic_bytes_out",
                                  "Bytes of record batches sent to consumers, per topic "
                                  "(BytesOutPerSec).", labels, registry=registry)
        self._messages_out = Counter("mink_broker_topic_messages_out",
                                     "Records in the batches sent to consumers, per topic.",
                                     labels, registry=registry)
        self._connections = Gauge("mink_connections", "Open Kafka client connections.",
                                  registry=registry)
        self._connections_accepted = Counter("mink_connections_accepted",
                                             "Kafka client connections accepted.",
                                             registry=registry)
        self._rebalances = Counter("mink_group_rebalances",
                                   "Rebalances started by this node's group coordinator.",
                                   registry=registry)
        self._store_latency = Histogram(
            "mink_object_store_request_latency_seconds",
            "Object store requests, per operation (create, get, delete, list, check).",
            ["operation"], buckets=LATENCY_BUCKETS, registry=registry)
        self._store_errors = Counter("mink_object_store_request_errors",
                                     "Object store requests that failed, per operation.",
                                     ["operation"], registry=registry)
        # Tiering (mink/broker/cluster/tiering.py): this node's rounds, whether it scheduled
        # them as the coordinator or ran what was handed to it as a writer-lease holder.
        self._tiering_rounds = Counter("mink_tiering_rounds",
                                       "Tiering rounds this node ran (its coordinator "
                                       "schedule and its writer-lease assignments).",
                                       registry=registry)
        self._tiering_objects = Counter("mink_tiering_stream_objects",
                                        "Stream objects this node wrote and swapped into "
                                        "the index.", registry=registry)
        self._tiering_bytes = Counter("mink_tiering_bytes",
                                      "Bytes of WAL data this node rewrote into stream "
                                      "objects (swapped).", registry=registry)
        self._tiering_refused = Counter(
            "mink_tiering_refused",
            "Stream objects refused at their begin or swap, per reason "
            "(stale_coordinator_epoch, stale_writer_lease_epoch, writer_lease_held, "
            "index_changed, unknown_upload, unknown_partition, invalid_rows).",
            ["reason"], registry=registry)
        # The log cleaner (mink/broker/cluster/compaction.py): the time of each pass swapped;
        # its counters and the KV tablets are read at scrape (admin/compaction_metrics.py).
        self._cleaner_pass_seconds = Histogram(
            "mink_log_cleaner_pass_seconds",
            "Time of each compaction pass this node swapped, from its plan to its swap.",
            buckets=PASS_BUCKETS, registry=registry)
        # Client quotas (mink/broker/quotas/): Kafka's throttle-time per quota type
        # (kafka.server:type=Produce|Fetch|Request); _count is the throttled responses.
        self._throttle = Histogram(
            "mink_quota_throttle_time_seconds",
            "Throttle time given to responses that passed a client quota, per quota type "
            "(produce, fetch, request); _count is the number of throttled responses.",
            ["quota"], buckets=THROTTLE_BUCKETS, registry=registry)
        self._throttle_children: dict[str, object] = {}
        # Security (mink/broker/security/): Kafka's successful-authentication-total,
        # failed-authentication-total and successful-reauthentication-total per listener.
        self._authentications = Counter(
            "mink_authentications",
            "Authentications per listener, mechanism (PLAIN, SCRAM-SHA-*, SSL for a client "
            "certificate or a failed TLS handshake) and result (success, failure, "
            "reauthentication).", ["listener", "mechanism", "result"], registry=registry)
        # Produce forwarding (mink/broker/server/produce_forwarding.py), by target node.
        self._forwarded = Counter(
            "mink_produce_forwarded_requests",
            "Produce parts forwarded to another node (one per target and request).",
            ["target"], registry=registry)
        self._forwarded_partitions = Counter(
            "mink_produce_forwarded_partitions",
            "Partitions of Produce requests forwarded to another node.", ["target"],
            registry=registry)
        self._forward_errors = Counter(
            "mink_produce_forward_errors",
            "Forwarded partitions answered with an error (the leader's, or NOT_LEADER_OR_"
            "FOLLOWER when nothing was sent, REQUEST_TIMED_OUT when the outcome is unknown).",
            ["target", "error"], registry=registry)
        self._forward_children: dict[int, tuple[object, object]] = {}
        # Coordinator forwarding (mink/broker/server/coordinator_forwarding.py).
        self._coordinator_forwarded = Counter(
            "mink_coordinator_forwarded_requests",
            "Group and transaction-coordinator requests forwarded to their coordinator and "
            "answered by it.", ["target", "api"], registry=registry)
        self._coordinator_forward_errors = Counter(
            "mink_coordinator_forward_errors",
            "Coordinator requests whose forwarding failed (the coordinator not reached or "
            "not answering in time): answered here, NOT_COORDINATOR.", ["target", "api"],
            registry=registry)
        self.storage = _StorageMeters(registry)
        self.lag = ConsumerLag(node)
        registry.register(_NodeStateCollector(self))
        self._requests: dict[tuple[int, int], object] = {}
        self._topics: dict[str, TopicMeters] = {}
        self._store_children: dict[str, tuple[object, object]] = {}

    # -- events, on the hot path: cached children --------------------------------------------

    def request(self, api_key: int, version: int):
        """The latency histogram child of (api, version): `.observe(seconds)`."""
        child = self._requests.get((api_key, version))
        if child is None:
            child = self._latency.labels(api_name(api_key), str(version))
            self._requests[(api_key, version)] = child
        return child

    def request_error(self, api_key: int, version: int, error: str) -> None:
        self._errors.labels(api_name(api_key), str(version), error).inc()

    def topic(self, name: str) -> TopicMeters:
        meters = self._topics.get(name)
        if meters is None:
            meters = TopicMeters(self._bytes_in.labels(name), self._messages_in.labels(name),
                                 self._bytes_out.labels(name), self._messages_out.labels(name))
            self._topics[name] = meters
        return meters

    def connection_opened(self) -> None:
        self._connections.inc()
        self._connections_accepted.inc()

    def connection_closed(self) -> None:
        self._connections.dec()

    def group_rebalance(self) -> None:
        self._rebalances.inc()

    def quota_throttled(self, quota: str, seconds: float) -> None:
        child = self._throttle_children.get(quota)
        if child is None:
            child = self._throttle_children[quota] = self._throttle.labels(quota)
        child.observe(seconds)

    def authentication(self, listener: str, mechanism: str, result: str) -> None:
        self._authentications.labels(listener, mechanism, result).inc()  # rare: no cache

    def produce_forwarded(self, target: int, partitions: int) -> None:
        children = self._forward_children.get(target)
        if children is None:
            children = self._forward_children[target] = (
                self._forwarded.labels(str(target)),
                self._forwarded_partitions.labels(str(target)))
        children[0].inc()
        children[1].inc(partitions)

    def produce_forward_error(self, target: int, error: str) -> None:
        self._forward_errors.labels(str(target), error).inc()

    def coordinator_forwarded(self, target: int, api_key: int) -> None:
        self._coordinator_forwarded.labels(str(target), str(int(api_key))).inc()

    def coordinator_forward_error(self, target: int, api_key: int) -> None:
        self._coordinator_forward_errors.labels(str(target), str(int(api_key))).inc()

    def observe_object_store(self, store):
        return InstrumentedObjectStore(store, self._object_store_request)

    def _object_store_request(self, operation: str, seconds: float, failed: bool) -> None:
        children = self._store_children.get(operation)
        if children is None:
            children = (self._store_latency.labels(operation),
                        self._store_errors.labels(operation))
            self._store_children[operation] = children
        children[0].observe(seconds)
        if failed:
            children[1].inc()

    def tiering_round(self) -> None:
        self._tiering_rounds.inc()

    def tiering_swapped(self, size: int) -> None:
        self._tiering_objects.inc()
        self._tiering_bytes.inc(size)

    def tiering_refused(self, reason: str) -> None:
        self._tiering_refused.labels(reason).inc()

    def compaction_pass(self, seconds: float) -> None:
        self._cleaner_pass_seconds.observe(seconds)

    # -- scrape ----------------------------------------------------------------------------

    def exposition(self) -> bytes:
        self._forget_deleted_topics()
        return generate_latest(self.registry)

    def _forget_deleted_topics(self) -> None:
        """A deleted topic's series go away with it (a re-created one starts from 0)."""
        topics = self.node.view.topics
        for name in [n for n in self._topics if n not in topics]:
            del self._topics[name]
            for family in (self._bytes_in, self._messages_in, self._bytes_out,
                           self._messages_out):
                try:
                    family.remove(name)
                except KeyError:
                    pass


class _StorageMeters(StorageObserver):
    """The WAL's and the partition logs' reports (mink.storage.observer)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._flush_bytes = Histogram("mink_wal_flush_size_bytes",
                                      "Size of each WAL object uploaded.",
                                      buckets=SIZE_BUCKETS, registry=registry)
        self._flush_latency = Histogram("mink_wal_flush_latency_seconds",
                                        "Upload time of each WAL object.",
                                        buckets=LATENCY_BUCKETS, registry=registry)
        self._flush_failures = Counter("mink_wal_flush_failures",
                                       "WAL object uploads that failed.", registry=registry)
        self._commit_latency = Histogram(
            "mink_wal_commit_latency_seconds",
            "Time from a CommitWal's first attempt to its known outcome.",
            buckets=LATENCY_BUCKETS, registry=registry)
        self._ranges = Counter(
            "mink_wal_commit_ranges",
            "Partition ranges decided by CommitWal: outcome committed, or refused with the "
            "reason PostgreSQL gave (stale_node_epoch, not_open_by_node, ...).",
            ["outcome", "reason"], registry=registry)
        self._in_doubt = Counter("mink_wal_commits_in_doubt",
                                 "CommitWal attempts whose outcome was unknown (repeated).",
                                 registry=registry)
        self._leader_changes = Counter(
            "mink_partition_leader_changes",
            "Partitions this node started (opened) or stopped leading.", ["change"],
            registry=registry)
        self._committed = self._ranges.labels("committed", "")
        self._refused: dict[str, object] = {}
        self._opened = self._leader_changes.labels("opened")
        self._closed = self._leader_changes.labels("closed")

    def wal_uploaded(self, size: int, seconds: float, failed: bool) -> None:
        if failed:
            self._flush_failures.inc()
            return
        self._flush_bytes.observe(size)
        self._flush_latency.observe(seconds)

    def wal_committed(self, seconds: float, accepted: int, refused: list[str]) -> None:
        self._commit_latency.observe(seconds)
        if accepted:
            self._committed.inc(accepted)
        for reason in refused:
            child = self._refused.get(reason)
            if child is None:
                child = self._refused[reason] = self._ranges.labels("refused", reason)
            child.inc()

    def wal_commit_in_doubt(self) -> None:
        self._in_doubt.inc()

    def partition_opened(self, topic_id: uuid.UUID, partition: int, leader_epoch: int) -> None:
        self._opened.inc()

    def partition_closed(self, topic_id: uuid.UUID, partition: int, reason: str) -> None:
        self._closed.inc()


def _gauge(name: str, documentation: str, value: float | None = None,
           labels: list[str] | None = None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=labels)
    if value is not None:
        family.add_metric([], value)
    return family


class _NodeStateCollector:
    """State read from the node at scrape time: nothing on the hot path."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics

    def describe(self):
        return []  # collected per scrape only (the registry does not call collect at register)

    def collect(self):
        node = self.metrics.node
        now = _trio_now()
        yield _gauge("mink_node_epoch", "This node's epoch (grows at every registration).",
                     node.membership.node_epoch)
        yield _gauge("mink_node_leading",
                     "1 while this node may act as a leader (registered, not self-fenced).",
                     1 if node.membership.may_lead() else 0)
        yield _gauge("mink_node_membership_valid_seconds",
                     "Seconds left before this node self-fences without a renewal "
                     "(negative: past it).",
                     (node.membership.valid_until - now) if now is not None and node.membership.leading else 0.0)
        holder = node.coordinator.is_holder
        yield _gauge("mink_cluster_coordinator", "1 while this node holds the coordinator "
                     "lease (Kafka's ActiveControllerCount).", 1 if holder else 0)
        yield _gauge("mink_cluster_coordinator_lease_epoch",
                     "The coordinator lease epoch while this node holds it, else 0.",
                     node.coordinator.lease_epoch if holder else 0)
        view = node.view
        yield _gauge("mink_view_version", "The version of the cluster view this node has.",
                     view.version)
        yield _gauge("mink_live_nodes", "Live nodes in this node's view.", len(view.brokers))
        assigned = sum(1 for topic in view.topics.values() for p in topic.partitions
                       if p.leader == node.node_id)
        streams = node.streams
        led = len(streams.logs) if streams is not None else 0
        yield _gauge("mink_partitions_led", "Partitions open on this node as their leader "
                     "(Kafka's LeaderCount).", led)
        yield _gauge("mink_partitions_opening",
                     "Partitions the view gives this node that are not open yet.",
                     max(0, assigned - led))
        wal = streams.wal if streams is not None else None
        yield _gauge("mink_wal_uploads_in_flight",
                     "WAL objects uploading or waiting for their commit.",
                     wal.objects_in_flight if wal is not None else 0)
        yield _gauge("mink_wal_unflushed_bytes", "Bytes appended and not committed yet.",
                     wal.unflushed_bytes if wal is not None else 0)
        cache = _gauge("mink_cache_bytes", "Bytes held by the read caches.", labels=["cache"])
        if streams is not None:
            cache.add_metric(["tail"], streams.caches.tail_used)
            cache.add_metric(["block"], streams.caches.block_used)
        yield cache
        groups = _gauge("mink_groups", "Consumer groups this node coordinates, by state.",
                        labels=["state"])
        states: dict[str, int] = {}
        for group in node.groups.groups.values():
            states[group.state.value] = states.get(group.state.value, 0) + 1
        for state, count in sorted(states.items()):
            groups.add_metric([state], count)
        yield groups
        sessions = node.fetch_sessions  # Kafka's FetchSessionCache metrics (KIP-227)
        yield _gauge("mink_fetch_sessions", "Incremental fetch sessions this node keeps "
                     "(NumIncrementalFetchSessions).", len(sessions))
        yield _gauge("mink_fetch_session_partitions", "Partitions held by those sessions "
                     "(NumIncrementalFetchPartitionsCached).", sessions.partitions_cached())
        yield CounterMetricFamily("mink_fetch_session_evictions", "Sessions evicted to make "
                                  "room for new ones (IncrementalFetchSessionEvictionsPerSec).",
                                  value=sessions.evictions)
        replicas = node.replica_reads  # fetch through any node (issue 25)
        yield _gauge("mink_replica_views", "Partitions led elsewhere this node serves "
                     "Fetches of (open replica views).", len(replicas.views))
        yield CounterMetricFamily("mink_replica_fetch_partitions", "Partitions of consumer "
                                  "Fetches served from a replica view (not led here).",
                                  value=replicas.fetches_served)
        yield CounterMetricFamily("mink_replica_end_reads", "PostgreSQL reads of the "
                                  "committed ends of replica views (the poller's and "
                                  "Fetches' own).", value=replicas.queries)
        yield from self.metrics.lag.families()
        yield from compaction_metrics.families(node)


def _trio_now() -> float | None:
    try:
        return trio.current_time()
    except RuntimeError:  # scraped from outside the node's trio thread
        return None


def node_metrics(node) -> NodeMetrics | NullMetrics:
    """Metrics are kept only where they can be read: with an admin listener."""
    return NodeMetrics(node) if node.config.admin_listener else NULL_METRICS


__all__ = ["NULL_METRICS", "NodeMetrics", "NullMetrics", "api_name", "node_metrics"]

"""A Mink node: wiring only. It builds the parts (the stores it shares with the others, its
membership, the sync of its view and partitions, topic admin, the coordinators, its Kafka
listener) and owns the one nursery they all run in.

Everything the node runs lives in the nursery of `run_node`; cancelling it stops the node.
"""

from __future__ import annotations

import socket
import logging
import math
from collections.abc import Callable

import trio
import trio_asyncio

from mink import collector
from mink.broker.admin.http import serve_admin
from mink.broker.admin.metrics import node_metrics
from mink.broker.cluster.controlled_shutdown import serve_shutdown_requests
from mink.broker.cluster.coordinator import ClusterCoordinator
from mink.broker.cluster.leases import BackgroundLeases
from mink.broker.cluster.compaction import LogCleaner
from mink.broker.cluster.lifecycle import LifecycleLoops
from mink.broker.cluster.tablets import TabletKeeper
from mink.broker.cluster.membership import Membership
from mink.broker.cluster.sync import PartitionSync
from mink.broker.cluster.tiering import TieringWorker
from mink.broker.cluster.view import ClusterView, TopicInfo
from mink.broker.config import Config
from mink.broker.dynamic_configs import DynamicConfigs
from mink.broker.groups.coordinator import GroupCoordinator
from mink.broker.logs import bind_node
from mink.broker.quotas.manager import QuotaManager
from mink.broker.security.authorizer import Authorizer
from mink.broker.server.fetch_sessions import FetchSessionCache
from mink.broker.server.forwarding import auto_create_via_coordinator
from mink.broker.server.forwarding import EnvelopeLinks
from mink.broker.server.peers import PeerPool
from mink.broker.server.replica_reads import ReplicaReads
from mink.broker.security.listeners import advertise
from mink.broker.security.ssl_principal import PrincipalMapper
from mink.broker.security.tls import inter_broker_security, server_context
from mink.broker.server.listener import serve_kafka
from mink.broker.topics.admin import TopicAdmin
from mink.broker.transactions.coordinator import TransactionCoordinator
from mink.broker.transactions.markers import MarkerWriter
from mink.broker.transactions.producer_ids import ProducerIdBlock
from mink.client import ClientSecurity
from mink.storage.log import PartitionLog
from mink.storage.controlplane import MetadataStore
from mink.storage.controlplane.security import set_node_endpoints
from mink.storage.objectstore import open_object_store
from mink.storage.producer_state import RefusedSequences
from mink.storage.streams import Streams

log = logging.getLogger(__name__)


class Node:
    def __init__(self, config: Config, metadata: MetadataStore, objects) -> None:
        self.config = config
        self.metrics = node_metrics(self)  # NULL_METRICS without an admin listener
        self.metadata = metadata
        self.objects = self.metrics.observe_object_store(objects)
        self.node_id = config.node_id
        # The inter-broker listener's advertised address (the node's row in PostgreSQL), and
        # every advertised listener: (name, security protocol, host, port), set by _serve.
        self.advertised: tuple[str, int] = config.advertised_address()
        self.endpoints: list[tuple[str, str, str, int]] = []
        self.inter_broker_listener = "PLAINTEXT"  # its name, set by _serve
        # how it reaches the other nodes' inter-broker listener (forwarding)
        self.inter_broker_security: ClientSecurity | None = None
        self.principal_mapper = PrincipalMapper(config.ssl_principal_mapping_rules)
        self.view = ClusterView(version=-1, cluster_id="", brokers={}, topics={})
        self.streams: Streams | None = None  # the partitions it leads, one per node epoch
        self.membership = Membership(self)  # register, renew, self-fence
        self.sync = PartitionSync(self)  # the view, and opening what it gives this node
        # create, delete, auto-create topics
        self.topic_admin = TopicAdmin(self, auto_create_via_coordinator)
        self.producer_ids = ProducerIdBlock(metadata)
        # Idempotent batches answered as not written, across reopenings and incarnations.
        self.refused_sequences = RefusedSequences()
        self.coordinator = ClusterCoordinator(self)
        self.leases = BackgroundLeases(self)
        self.lifecycle = LifecycleLoops(self)  # retention, log starts, collection
        self.tiering = TieringWorker(self)  # WAL objects into stream objects (coordinator)
        self.cleaner = LogCleaner(self)  # compaction of compacted topics (writer leases)
        self.tablets = TabletKeeper(self)  # KV tablets of the compacted partitions it leads
        # broker and group configs, read when the view moves (as quotas and ACLs are)
        self.dynamic_configs = DynamicConfigs(self)
        self.groups = GroupCoordinator(self)  # the consumer group coordinator
        self.transactions = TransactionCoordinator(self)  # transactional ids
        self.markers = MarkerWriter(self)  # transaction markers of the partitions it leads
        self.quotas = QuotaManager(self)  # client quotas, read when the view moves
        self.authorizer = Authorizer(self)  # ACLs, read when the view moves (off by default)
        self.fetch_sessions = FetchSessionCache(  # KIP-227 incremental fetch sessions
            config.max_incremental_fetch_session_cache_slots,
            config.min_incremental_fetch_session_eviction_ms / 1000)
        self.ready = trio.Event()  # registered and its view loaded: requests may be served
        # False: stopping leaves the membership and the coordinator lease to expire, as after
        # a crash (the test harness's in-process "kill").
        self.leave_on_stop = True
        # A controlled shutdown began (mink.broker.cluster.controlled_shutdown): no new work.
        self.stopping = False
        self.shutdown_requested = trio.Event()  # set by `mink serve` at the first signal
        self.handed_over = trio.Event()  # set once the controlled shutdown is over
        self.nursery: trio.Nursery | None = None  # the one nursery, set by _serve
        self.peers = PeerPool(self)  # connections to the other nodes (produce forwarding)
        self.replica_reads = ReplicaReads(self)  # Fetches of partitions led elsewhere
        # kept-open connections, one call at a time each (coordinator forwarding)
        self.envelope_links = EnvelopeLinks(self)

    @property
    def draining(self) -> bool:
        """Whether this node takes no new work: it is stopping cleanly, or the view says it
        drains (`mink cluster drain`, sql/0027)."""
        me = self.view.brokers.get(self.node_id)
        return self.stopping or (me is not None and me.draining)

    def leader_log(self, topic: TopicInfo, partition: int) -> PartitionLog | None:
        """The open log of a partition this node leads, or None (not the leader, still
        opening, or its membership is past its validity deadline): the caller answers
        NOT_LEADER_OR_FOLLOWER."""
        if self.streams is None or not self.membership.may_lead():
            return None
        partition_log = self.streams.get(topic.topic_id, partition)
        if partition_log is None or partition_log.closed is not None:
            return None
        return partition_log


async def run_node(config: Config, *, objects=None, freeze_heap: bool = True,
                   migrate: bool = True, on_started: Callable[[Node], None] | None = None,
                   task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Open the stores, register, serve until cancelled; reports the advertised (host, port).

    For embedding (mink.testing): `objects` is a store the caller opened and closes (used
    instead of `config.object_store`); `freeze_heap=False` leaves the host process's garbage
    collector alone; `migrate=False` skips the migrations check, for a database the caller
    cloned from a template migrated by this same code; `on_started(node)` is called once the
    node serves."""
    async with trio_asyncio.open_loop():
        owned = objects is None
        if owned:
            objects = open_object_store(
                config.object_store, endpoint_url=config.s3_endpoint_url,
                region=config.s3_region, access_key_id=config.s3_access_key_id,
                secret_access_key=config.s3_secret_access_key)
        try:
            await objects.check()
            metadata = await MetadataStore.open(config.postgres_url, migrate=migrate)
            try:
                await _serve(Node(config, metadata, objects), task_status, freeze_heap,
                             on_started)
            finally:
                with trio.CancelScope(shield=True):
                    await metadata.aclose()
        finally:
            if owned:
                with trio.CancelScope(shield=True):
                    await objects.aclose()


async def _serve(node: Node, task_status, freeze_heap: bool = True,
                 on_started: Callable[[Node], None] | None = None) -> None:
    config = node.config
    listeners, advertised = config.kafka_listeners()
    inter_broker = node.inter_broker_listener = config.inter_broker_listener()
    context = (server_context(config) if any(lst.protocol.tls for lst in listeners)
               else None)
    bind_node(node)  # every log line of this node's tasks names it (mink/broker/logs.py)
    async with trio.open_nursery() as nursery:
        node.nursery = nursery
        await nursery.start(node.peers.run)
        await nursery.start(node.envelope_links.run)
        bound = {}
        for lst in listeners:
            bound[lst.name] = await nursery.start(
                serve_kafka, node, lst, config.socket_request_max_bytes,
                context if lst.protocol.tls else None)
        await nursery.start(serve_admin, node)  # off unless admin_listener is set
        # A listener on port 0 advertises the port it got; an unset host, the bound one.
        shown = advertise(listeners, advertised, socket.getfqdn())
        node.endpoints = [
            (a.name, a.protocol.value,
             a.host or bound[a.name][0],
             bound[a.name][1] if a.port == 0 else a.port) for a in shown]
        node.advertised = next((e[2], e[3]) for e in node.endpoints if e[0] == inter_broker)
        node.inter_broker_security = inter_broker_security(
            config, next(lst for lst in listeners if lst.name == inter_broker))
        nursery.start_soon(node.quotas.run)
        await node.membership.open_store()
        try:
            await node.membership.register_at_start()
        except BaseException:
            with trio.CancelScope(shield=True):
                await node.membership.close_store()
            raise
        try:
            # after registering: a process refused the node id must not overwrite the live
            # one's endpoints (the write is fenced by the node epoch)
            if not await set_node_endpoints(node.metadata, node.node_id,
                                            node.membership.node_epoch, node.endpoints):
                log.warning("advertised listeners not stored: node epoch %d is not current",
                            node.membership.node_epoch)
            await node.membership.start_streams()
            node.ready.set()
            nursery.start_soon(node.membership.renewal_loop)
            nursery.start_soon(node.membership.fencing_watchdog)
            nursery.start_soon(node.producer_ids.run)
            nursery.start_soon(node.sync.run)
            nursery.start_soon(node.coordinator.run)
            nursery.start_soon(node.leases.run)
            nursery.start_soon(node.lifecycle.run)
            nursery.start_soon(node.tiering.run)
            nursery.start_soon(node.cleaner.run)
            nursery.start_soon(node.tablets.run)
            await nursery.start(node.groups.run)
            nursery.start_soon(node.transactions.run)
            nursery.start_soon(node.markers.run)
            nursery.start_soon(node.replica_reads.run)  # views of partitions led elsewhere
            nursery.start_soon(serve_shutdown_requests, node)  # controlled shutdown
            if on_started is not None:
                on_started(node)
            task_status.started(node.advertised)
            if freeze_heap:
                # What start-up built lives as long as the node (mink.collector).
                collector.freeze_heap()
            await trio.sleep(math.inf)
        finally:
            if node.leave_on_stop:  # False after a harness kill: nothing is released
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    try:
                        await node.coordinator.release()
                        await node.metadata.leave(node.node_id, node.membership.node_epoch)
                        log.info("node %d left the cluster", node.node_id)
                    except Exception as exc:  # the membership expires by itself
                        log.warning("could not leave cleanly: %s", exc)
            with trio.CancelScope(shield=True):
                await node.membership.close_store()


"""The transaction coordinator (Kafka's TransactionCoordinator / TransactionStateManager).

A transactional id maps to a partition of `__transaction_state` by Kafka's hash (as groups
map to `__consumer_offsets`); the node leading that partition coordinates it. The state lives
in PostgreSQL only (`mink.storage.controlplane.transactions`): every request reads it, the
pure rules of `state.py` decide, and one compare-and-set fenced by that partition's leader
epoch writes it. A new coordinator after a failover has nothing to load: it reads the same
rows, and the markers of a decided transaction are written by the data partitions' leaders
(`markers.py`) whoever coordinates.

Requests for one transactional id are applied one at a time on this node (a lock per id),
so the compare-and-set only fails when another node wrote meanwhile, i.e. this one was
fenced.
"""

from __future__ import annotations

import logging
import uuid

import trio
from kio.schema.errors import ErrorCode

from mink.broker.groups.coordinator import partition_for
from mink.broker.topics.admin import NotClusterCoordinator
from mink.broker.transactions import state as rules
from mink.broker.transactions.producer_ids import ProducerIdsUnavailable
from mink.protocol.topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from mink.storage import controlplane as md
from mink.storage.controlplane.groups import Fence
from mink.storage.controlplane.transactions import (
    NotTransactionCoordinator,
    PendingMarker,
    TransactionStore,
    TxnDescription,
    TxnRecord,
    WriteConflict,
)

log = logging.getLogger(__name__)

CREATE_REQUEST = "transaction_state"  # the cluster request asking the holder for the topic
WAIT_S = 5.0  # the longest a request waits on PostgreSQL before a retriable answer
# A request finding the transaction's markers still being written waits this long for them
# before it answers CONCURRENT_TRANSACTIONS: the markers of a commit usually take a few ms,
# and a client's retry backoff (100 ms by default) is the latency a producer starting its
# next transaction at once would otherwise pay.
COMPLETE_WAIT_S = 0.25
COMPLETE_POLL_S = 0.005


class TransactionCoordinator:
    def __init__(self, node) -> None:
        self.node = node
        config = node.config
        self.num_partitions = config.transaction_state_num_partitions
        self.max_timeout_ms = config.transaction_max_timeout_ms
        self.abort_interval_s = (
            config.transaction_abort_timed_out_transaction_cleanup_interval_ms / 1000)
        self.expiration_ms = config.transactional_id_expiration_ms
        self.expire_interval_s = (
            config.transaction_remove_expired_transaction_cleanup_interval_ms / 1000)
        self.store = TransactionStore(node.metadata)
        self._locks: dict[str, trio.Lock] = {}
        self._topic_wanted = False
        self.unverified_batches = 0  # refused because PostgreSQL could not verify (tests)

    # -- life cycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Create __transaction_state when it is first wanted; abort timed-out transactions
        and remove expired transactional ids of the partitions this node leads."""
        next_abort_check = next_expiry = trio.current_time()
        while True:
            try:
                await self._ensure_topic()
                if trio.current_time() >= next_abort_check:
                    next_abort_check = trio.current_time() + self.abort_interval_s
                    await self.abort_timed_out()
                if trio.current_time() >= next_expiry:
                    next_expiry = trio.current_time() + self.expire_interval_s
                    await self.expire_transactional_ids()
            except (md.MetadataError, trio.TooSlowError) as exc:
                log.warning("transaction coordinator round skipped: %s",
                            exc or "PostgreSQL did not answer")
            await trio.sleep(min(1.0, self.abort_interval_s, self.expire_interval_s))

    def _topic(self):
        return self.node.view.topics.get(TRANSACTION_STATE_TOPIC)

    async def _ensure_topic(self) -> None:
        node = self.node
        if self._topic() is not None:
            return
        if node.coordinator.is_holder:
            requests = await node.metadata.pending_cluster_requests(CREATE_REQUEST)
            if not (self._topic_wanted or requests):
                return
            try:
                await node.topic_admin.create_topic(TRANSACTION_STATE_TOPIC,
                                                    self.num_partitions, {})
                log.info("created %s with %d partitions", TRANSACTION_STATE_TOPIC,
                         self.num_partitions)
            except md.TopicExists:
                pass
            except NotClusterCoordinator as exc:
                log.warning("could not create %s yet: %s", TRANSACTION_STATE_TOPIC, exc)
                return
            for request_id in requests:
                await node.metadata.finish_cluster_request(request_id, {"created": True})
        elif self._topic_wanted:
            self._topic_wanted = False  # asked once; asked again if still missing later
            await node.metadata.request_cluster_action(CREATE_REQUEST)

    # -- finding the coordinator ---------------------------------------------------------------

    def coordinator_for(self, transactional_id: str):
        """(error, BrokerInfo | None): the live leader of the id's partition."""
        topic = self._topic()
        if topic is None:
            self._topic_wanted = True
            return ErrorCode.coordinator_not_available, None
        leader = topic.partitions[partition_for(transactional_id, len(topic.partitions))].leader
        broker = self.node.view.brokers.get(leader) if leader is not None else None
        if broker is None:
            return ErrorCode.coordinator_not_available, None
        return ErrorCode.none, broker

    def _fence(self, transactional_id: str) -> tuple[ErrorCode, Fence | None, int]:
        """The fence of the id's partition if this node coordinates it."""
        topic = self._topic()
        if topic is None:
            self._topic_wanted = True
            return ErrorCode.coordinator_not_available, None, -1
        index = partition_for(transactional_id, len(topic.partitions))
        partition_log = self.node.leader_log(topic, index)
        if partition_log is None:
            if topic.partitions[index].leader == self.node.node_id:
                return ErrorCode.coordinator_load_in_progress, None, index
            return ErrorCode.not_coordinator, None, index
        return ErrorCode.none, Fence(topic.topic_id, index, partition_log.leader_epoch,
                                     self.node.node_id,
                                     self.node.membership.node_epoch), index

    def led_partitions(self) -> list[int]:
        topic = self._topic()
        if topic is None:
            return []
        return [p.index for p in topic.partitions
                if self.node.leader_log(topic, p.index) is not None]

    # -- the requests --------------------------------------------------------------------------

    async def _apply(self, transactional_id: str, decide, *, timeout_ms: int | None = None):
        """Read, decide, write: returns the Decision (with the answer's producer id filled
        in) or raises _Answer with the error to send."""
        error, fence, _ = self._fence(transactional_id)
        if error:
            raise _Answer(error)
        lock = self._locks.setdefault(transactional_id, trio.Lock())
        try:
            async with lock:
                with trio.fail_after(WAIT_S):
                    for _attempt in range(2):
                        stored = await self.store.read(transactional_id)
                        settle_by = trio.current_time() + COMPLETE_WAIT_S
                        while stored is not None and stored.state in rules.PREPARING and (
                                trio.current_time() < settle_by):
                            await trio.sleep(COMPLETE_POLL_S)
                            stored = await self.store.read(transactional_id)
                        decision = decide(_stored(stored))
                        write = decision.write
                        if write is None:
                            return decision
                        pid = write.producer_id
                        if pid == rules.NEW_PRODUCER_ID:
                            pid = await self.node.producer_ids.next_id()
                            decision = rules.Decision(
                                decision.error, rules.Write(write.state, pid,
                                                            write.producer_epoch,
                                                            write.timeout_ms, write.add),
                                (pid, decision.answer[1]))
                        try:
                            await self.store.write(
                                fence, transactional_id,
                                stored.version if stored is not None else -1, pid,
                                write.producer_epoch, write.timeout_ms, write.state,
                                list(write.add))
                        except WriteConflict:
                            continue  # read again: what changed may answer the request
                        if write.state in rules.PREPARING:
                            partitions = {*stored.partitions, *write.add} if stored else set()
                            self.node.markers.submit([PendingMarker(
                                topic_id, partition, pid, write.producer_epoch,
                                write.state == rules.PREPARE_COMMIT, fence.leader_epoch)
                                for topic_id, partition in partitions])
                            log.info("transaction %r of producer %d epoch %d: %s",
                                     transactional_id, pid, write.producer_epoch,
                                     write.state)
                        return decision
                    raise _Answer(ErrorCode.not_coordinator)
        except trio.TooSlowError:
            raise _Answer(ErrorCode.coordinator_not_available) from None
        except NotTransactionCoordinator as exc:
            log.warning("transaction %r: %s", transactional_id, exc)
            raise _Answer(ErrorCode.not_coordinator) from None
        except (md.MetadataError, ProducerIdsUnavailable) as exc:
            log.warning("transaction %r: PostgreSQL: %s", transactional_id, exc)
            raise _Answer(ErrorCode.coordinator_not_available) from None
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._locks.pop(transactional_id, None)

    async def init_producer_id(self, transactional_id: str, timeout_ms: int,
                               producer_id: int, producer_epoch: int
                               ) -> tuple[ErrorCode, int, int]:
        if not transactional_id:
            return ErrorCode.invalid_request, -1, -1
        if timeout_ms <= 0 or timeout_ms > self.max_timeout_ms:
            return ErrorCode.invalid_transaction_timeout, -1, -1
        try:
            decision = await self._apply(transactional_id, lambda s: rules.init_producer_id(
                s, timeout_ms, producer_id, producer_epoch))
        except _Answer as answer:
            return answer.error, -1, -1
        if decision.error:
            return decision.error, -1, -1
        return ErrorCode.none, *decision.answer

    async def add_partitions(self, transactional_id: str, producer_id: int,
                             producer_epoch: int, partitions: set[tuple[uuid.UUID, int]]
                             ) -> ErrorCode:
        try:
            decision = await self._apply(transactional_id, lambda s: rules.add_partitions(
                s, producer_id, producer_epoch, partitions))
        except _Answer as answer:
            return answer.error
        return decision.error

    async def verify_partitions(self, transactional_id: str, producer_id: int,
                                producer_epoch: int, partitions: set[tuple[uuid.UUID, int]]
                                ) -> ErrorCode:
        error, _, _ = self._fence(transactional_id)
        if error:
            return error
        try:
            with trio.fail_after(WAIT_S):
                stored = await self.store.read(transactional_id)
        except (trio.TooSlowError, md.MetadataError):
            return ErrorCode.coordinator_not_available
        return rules.verify_partitions(_stored(stored), producer_id, producer_epoch,
                                       partitions)

    def group_partition(self, group_id: str) -> tuple[uuid.UUID, int] | None:
        """AddOffsetsToTxn: the group's partition of __consumer_offsets joins the
        transaction (its marker is the group coordinator's)."""
        topic = self.node.view.topics.get(OFFSETS_TOPIC)
        if topic is None:
            return None
        return topic.topic_id, partition_for(group_id, len(topic.partitions))

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                      commit: bool) -> ErrorCode:
        try:
            decision = await self._apply(transactional_id, lambda s: rules.end_txn(
                s, producer_id, producer_epoch, commit))
        except _Answer as answer:
            return answer.error
        return decision.error

    async def expire_transactional_ids(self) -> int:
        """transactional.id.expiration.ms: remove the idle ids this node coordinates."""
        led = self.led_partitions()
        if not led:
            return 0
        with trio.fail_after(WAIT_S):
            expired = await self.store.expire(led, self.expiration_ms)
        if expired:
            log.info("%d transactional id(s) expired (idle over %d ms), e.g. %r",
                     len(expired), self.expiration_ms, expired[0])
        return len(expired)

    async def abort_timed_out(self) -> int:
        """Abort (with an epoch bump) every transaction of the partitions this node
        coordinates that is open past its timeout; returns how many."""
        led = self.led_partitions()
        if not led:
            return 0
        aborted = 0
        for transactional_id in await self.store.timed_out(led):
            try:
                decision = await self._apply(transactional_id, rules.abort_timed_out)
            except _Answer:
                continue
            if decision.write is not None:
                aborted += 1
                log.info("transaction %r aborted: open past its timeout", transactional_id)
        return aborted


    # -- describing (admin clients) ------------------------------------------------------------

    async def describe(self, transactional_ids: list[str]
                       ) -> list[tuple[str, ErrorCode, TxnDescription | None]]:
        """DescribeTransactions: per id, the error (NOT_COORDINATOR when another node
        coordinates it, TRANSACTIONAL_ID_NOT_FOUND when it has no state) or its state."""
        answers: dict[str, tuple[ErrorCode, TxnDescription | None]] = {}
        mine = []
        for transactional_id in transactional_ids:
            error, _, _ = self._fence(transactional_id) if transactional_id else (
                ErrorCode.transactional_id_not_found, None, -1)
            if error:
                answers[transactional_id] = (error, None)
            else:
                mine.append(transactional_id)
        if mine:
            try:
                with trio.fail_after(WAIT_S):
                    found = await self.store.describe(mine)
            except (trio.TooSlowError, md.MetadataError) as exc:
                log.warning("DescribeTransactions: PostgreSQL: %s", exc or "no answer")
                found = None
            for transactional_id in mine:
                if found is None:
                    answers[transactional_id] = (ErrorCode.coordinator_not_available, None)
                elif transactional_id in found:
                    answers[transactional_id] = (ErrorCode.none, found[transactional_id])
                else:
                    answers[transactional_id] = (ErrorCode.transactional_id_not_found, None)
        return [(t, *answers[t]) for t in transactional_ids]

    async def list_transactions(self, states: list[str], producer_ids: list[int],
                                min_duration_ms: int = -1
                                ) -> tuple[ErrorCode, list[str], list[tuple[str, int, str]]]:
        """ListTransactions over the partitions of __transaction_state this node leads:
        (error, unknown state filters, [(transactional id, producer id, state)]). As
        Kafka, unknown state names are reported and leave the filter; a partition this node
        is still opening answers COORDINATOR_LOAD_IN_PROGRESS."""
        known = [s for s in states if s in rules.KAFKA_STATES]
        unknown = [s for s in states if s not in rules.KAFKA_STATES]
        topic = self._topic()
        if topic is None:
            return ErrorCode.none, unknown, []
        led = self.led_partitions()
        if any(p.leader == self.node.node_id and p.index not in led for p in topic.partitions):
            return ErrorCode.coordinator_load_in_progress, unknown, []
        if not led:
            return ErrorCode.none, unknown, []
        try:
            with trio.fail_after(WAIT_S):
                rows = await self.store.list(led, known, producer_ids, min_duration_ms)
        except (trio.TooSlowError, md.MetadataError) as exc:
            log.warning("ListTransactions: PostgreSQL: %s", exc or "no answer")
            return ErrorCode.coordinator_not_available, unknown, []
        return ErrorCode.none, unknown, rows


class _Answer(Exception):
    def __init__(self, error: ErrorCode):
        super().__init__(error.name)
        self.error = error


def _stored(record: TxnRecord | None) -> rules.Stored | None:
    if record is None:
        return None
    return rules.Stored(record.producer_id, record.producer_epoch, record.timeout_ms,
                        record.state, frozenset(record.partitions))

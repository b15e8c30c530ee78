"""The idempotent producer: InitProducerId, sequence checks, duplicates across retries and
restarts."""

from __future__ import annotations

import collections
import functools
import time

import trio

from mink.client import KafkaClient
from mink.protocol.records import Record, build_batch
from mink.storage.embedded_postgres import free_port
from mink.storage.producer_state import (
    ProducerAppend,
    ProducerError,
    ProducerStateManager,
)
from tests.support.nodes import node_config
from tests.support.raw import (
    init_producer_id_request,
    produce_request,
    produce_result,
)
from tests.test_interop import confluent_consume, confluent_produce

NONE, OUT_OF_ORDER, INVALID_EPOCH, STORAGE_ERROR = 0, 45, 47, 56


def idempotent_batch(producer_id: int, epoch: int, sequence: int, values: list[bytes]) -> bytes:
    return build_batch([Record(i, 0, None, v) for i, v in enumerate(values)],
                       producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)


async def test_same_request_twice_is_written_once(node):
    client = await KafkaClient.connect(node)
    init = await client.call(22, 4, init_producer_id_request())
    assert init.error_code == NONE and init.producer_id >= 0 and init.producer_epoch == 0
    # A first, non-idempotent produce creates the topic (auto-creation).
    await client.call(0, 9, produce_request("dups", 0, build_batch([Record(0, 0, None, b"x")])))
    request = produce_request("dups", 0, idempotent_batch(init.producer_id, 0, 0,
                                                          [b"a", b"b", b"c"]))
    first = produce_result(await client.call(0, 9, request))
    again = produce_result(await client.call(0, 9, request))
    assert first == again == (NONE, 1)
    follow = produce_result(await client.call(0, 9, produce_request(
        "dups", 0, idempotent_batch(init.producer_id, 0, 3, [b"d"]))))
    assert follow == (NONE, 4), "the duplicate wrote nothing"
    await client.aclose()
    values = await trio.to_thread.run_sync(
        lambda: confluent_consume(node, "dups", 5, partitions=1))
    assert [m.value() for m in values] == [b"x", b"a", b"b", b"c", b"d"]


async def test_pipelined_retry_of_an_in_flight_batch_waits_for_it(pg_url, pg_proxy,
                                                                   store_url, nursery):
    from mink.broker.node import run_node
    from tests.support.postgres import via_proxy

    started = []
    host, port = await nursery.start(functools.partial(
        run_node, node_config(via_proxy(pg_url, pg_proxy), store_url),
        on_started=started.append))
    client = await KafkaClient.connect(f"{host}:{port}")
    init = await client.call(22, 4, init_producer_id_request())
    await client.call(0, 9, produce_request("inflight", 0, build_batch([Record(0, 0, None, b"x")])))
    request = produce_request("inflight", 0, idempotent_batch(init.producer_id, 0, 0, [b"a"]))
    # The retry is sent while the first is still in flight (its commit cannot reach
    # PostgreSQL): it must wait for it, not be appended again, nor pass as committed.
    pg_proxy.stall()
    await client.send(0, 9, request)
    await client.send(0, 9, request)
    with trio.fail_after(30):  # both wait on the first one's append, whose commit is held
        while (_waiters_on_pending_append(started[0], init.producer_id) < 2
               or pg_proxy.bytes_held_to_upstream == 0):
            await trio.sleep(0.01)
    pg_proxy.resume()
    results = [produce_result((await client.receive(0, 9))[1]) for _ in range(2)]
    assert results == [(NONE, 1), (NONE, 1)]
    assert produce_result(await client.call(0, 9, produce_request(
        "inflight", 0, idempotent_batch(init.producer_id, 0, 1, [b"b"])))) == (NONE, 2)
    await client.aclose()


async def test_a_batch_behind_one_refused_while_frozen_is_answered_retriably(
        pg_url, pg_proxy, store_url, nursery):
    """PostgreSQL stalls under a commit: the partition freezes and refuses sequence 2 as not
    written (KAFKA_STORAGE_ERROR). Once the commit lands, sequence 3 (pipelined behind 2 in
    a client) is answered KAFKA_STORAGE_ERROR too, not OUT_OF_ORDER_SEQUENCE_NUMBER, on which
    librdkafka would bump its epoch and re-send possibly written batches as new (issue 11)."""
    from mink.broker.node import run_node
    from tests.support.postgres import via_proxy

    started = []
    host, port = await nursery.start(functools.partial(
        run_node, node_config(via_proxy(pg_url, pg_proxy), store_url, commit_timeout=1.0,
                              lease_ttl=30.0),
        on_started=started.append))
    client = await KafkaClient.connect(f"{host}:{port}")
    pid = (await client.call(22, 4, init_producer_id_request())).producer_id

    def batch(sequence: int):
        # A long timeout: after a stall, PostgreSQL connections take seconds to come back.
        return produce_request("gapped", 0, idempotent_batch(pid, 0, sequence,
                                                             [b"s%d" % sequence]), timeout_s=60)

    await client.call(0, 9, produce_request("gapped", 0, build_batch([Record(0, 0, None, b"x")])))
    assert produce_result(await client.call(0, 9, batch(0))) == (NONE, 1)
    pg_proxy.stall()
    await client.send(0, 9, batch(1))
    with trio.fail_after(30):  # its commit is in doubt: the partition freezes
        while not any(log_.frozen for log_ in started[0].streams.logs.values()):
            await trio.sleep(0.01)
    # (On a second connection: answers on one connection keep the order of the requests.)
    other = await KafkaClient.connect(f"{host}:{port}")
    assert produce_result(await other.call(0, 9, batch(2))) == (STORAGE_ERROR, -1)
    await other.aclose()
    pg_proxy.resume()
    assert produce_result((await client.receive(0, 9))[1]) == (NONE, 2)
    assert produce_result(await client.call(0, 9, batch(3))) == (STORAGE_ERROR, -1)
    assert produce_result(await client.call(0, 9, batch(2))) == (NONE, 3)
    assert produce_result(await client.call(0, 9, batch(3))) == (NONE, 4)
    await client.aclose()


def _waiters_on_pending_append(node, producer_id: int) -> int:
    """How many tasks wait for the producer's in-flight append (0 when there is none)."""
    for partition_log in node.streams.logs.values():
        entry = partition_log.producers.current.get(producer_id)
        if entry is not None and entry.batches and entry.batches[-1].pending is not None:
            return entry.batches[-1].pending.done.statistics().tasks_waiting
    return 0


async def test_out_of_order_and_stale_epoch_are_refused(node):
    client = await KafkaClient.connect(node)
    init = await client.call(22, 4, init_producer_id_request())
    pid = init.producer_id
    await client.call(0, 9, produce_request("order", 0, build_batch([Record(0, 0, None, b"x")])))
    ok = await client.call(0, 9, produce_request("order", 0, idempotent_batch(pid, 0, 0, [b"a"])))
    assert produce_result(ok)[0] == NONE
    gap = await client.call(0, 9, produce_request("order", 0, idempotent_batch(pid, 0, 5, [b"b"])))
    assert produce_result(gap) == (OUT_OF_ORDER, -1)
    # Bump the epoch (KIP-360): the same id, the next epoch, starting again at sequence 0.
    bumped = await client.call(22, 4, init_producer_id_request(producer_id=pid, epoch=0))
    assert (bumped.error_code, bumped.producer_id, bumped.producer_epoch) == (NONE, pid, 1)
    new_epoch_bad_seq = await client.call(0, 9, produce_request(
        "order", 0, idempotent_batch(pid, 1, 7, [b"c"])))
    assert produce_result(new_epoch_bad_seq)[0] == OUT_OF_ORDER
    new_epoch = await client.call(0, 9, produce_request(
        "order", 0, idempotent_batch(pid, 1, 0, [b"c"])))
    assert produce_result(new_epoch)[0] == NONE
    stale = await client.call(0, 9, produce_request(
        "order", 0, idempotent_batch(pid, 0, 1, [b"d"])))
    assert produce_result(stale) == (INVALID_EPOCH, -1)
    await client.aclose()


async def test_producer_ids_are_never_reused(node):
    client = await KafkaClient.connect(node)
    ids = [(await client.call(22, 4, init_producer_id_request())).producer_id for _ in range(5)]
    assert len(set(ids)) == 5
    unknown = await client.call(22, 4, init_producer_id_request(producer_id=10**12, epoch=0))
    assert unknown.error_code == 49  # INVALID_PRODUCER_ID_MAPPING
    await client.aclose()


async def test_duplicate_recognised_after_kill_and_restart(pg_url, store_url, node_processes):
    config = node_config(pg_url, store_url, listener=f"127.0.0.1:{free_port()}")
    first = node_processes(config)
    await trio.to_thread.run_sync(first.start)
    client = await KafkaClient.connect(first.address)
    init = await client.call(22, 4, init_producer_id_request())
    await client.call(0, 9, produce_request("restart", 0, build_batch([Record(0, 0, None, b"x")])))
    request = produce_request("restart", 0, idempotent_batch(init.producer_id, 0, 0,
                                                             [b"acked"]))
    assert produce_result(await client.call(0, 9, request)) == (NONE, 1)
    await client.aclose()
    first.kill()
    second = node_processes(config)
    await trio.to_thread.run_sync(second.start)
    with trio.fail_after(30):
        while True:  # the partition is opening: NOT_LEADER_OR_FOLLOWER until it is
            client = await KafkaClient.connect(second.address)
            result = produce_result(await client.call(0, 9, request))
            await client.aclose()
            if result[0] != 6:
                break
            await trio.sleep(0.1)
    assert result == (NONE, 1), "the retried batch must be recognised as a duplicate"
    values = await trio.to_thread.run_sync(
        lambda: confluent_consume(second.address, "restart", 2, partitions=1, timeout=10))
    assert [m.value() for m in values] == [b"x", b"acked"]


def _no_duplicates(messages) -> None:
    values = [m for m in messages]
    counts = collections.Counter(values)
    assert all(c == 1 for c in counts.values()), [v for v, c in counts.items() if c > 1][:5]


async def test_confluent_idempotent_producer(node):
    n = 10_000

    def run():
        confluent_produce(node, "idem-confluent",
                          [{"value": b"v%d" % i, "key": b"k%d" % (i % 7)} for i in range(n)],
                          **{"enable.idempotence": True})
        return [m.value() for m in confluent_consume(node, "idem-confluent", n, partitions=1)]

    values = await trio.to_thread.run_sync(run)
    assert len(values) == n
    _no_duplicates(values)
    assert set(values) == {b"v%d" % i for i in range(n)}


async def test_kafka_python_default_producer_is_idempotent(node):
    n = 10_000

    def run():
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=node)  # idempotence on by default
        assert producer.config["enable_idempotence"]
        futures = [producer.send("idem-kafka-python", value=b"v%d" % i) for i in range(n)]
        producer.flush(60)
        offsets = [f.get(timeout=1).offset for f in futures]
        producer.close()
        consumed = [m.value() for m in confluent_consume(node, "idem-kafka-python", n,
                                                        partitions=1)]
        return offsets, consumed

    offsets, consumed = await trio.to_thread.run_sync(run)
    assert sorted(offsets) == list(range(n))
    _no_duplicates(consumed)
    assert consumed == [b"v%d" % i for i in range(n)]


def test_sequence_rules_as_kafka():
    state = ProducerStateManager()
    first = ProducerAppend(7, 0, 100, 104)
    assert state.check(first) is None  # an unknown producer may start anywhere
    state.record(first, 0, 4, None)
    assert state.check(ProducerAppend(7, 0, 100, 104)).base_offset == 0  # duplicate
    assert state.check(ProducerAppend(7, 0, 105, 105)) is None
    for bad in (ProducerAppend(7, 0, 106, 106), ProducerAppend(7, 1, 3, 3)):
        try:
            state.check(bad)
        except ProducerError as exc:
            assert exc.kind == "out_of_order_sequence_number"
        else:
            raise AssertionError(f"{bad} accepted")
    wrap = ProducerStateManager()
    wrap.record(ProducerAppend(1, 0, 2**31 - 3, 2**31 - 1), 0, 2, None)
    assert wrap.check(ProducerAppend(1, 0, 0, 4)) is None  # sequences wrap after 2^31 - 1


class _HeldWal:
    """A WAL buffer that keeps what is added (nothing is uploaded or committed)."""

    def __init__(self):
        self.added = []

    def add(self, log_, pending, data, max_timestamp, batch_count, producer_states):
        self.added.append(pending)


def _append(log_, producer_id: int, epoch: int, sequence: int):
    batch = bytearray(idempotent_batch(producer_id, epoch, sequence, [b"v%d" % sequence]))
    return log_.append(batch, [1], 0, ProducerAppend(producer_id, epoch, sequence, sequence))


def test_a_gap_this_node_made_is_answered_retriably():
    """A batch pipelined behind one this node refused as not written (frozen, failed,
    not leading) is answered retriably, not OUT_OF_ORDER_SEQUENCE_NUMBER: librdkafka bumps
    its epoch on the latter and re-sends possibly written batches of other partitions as
    new ones (the duplicates of the fault campaign, issue 11). A gap nobody here made is
    still OUT_OF_ORDER_SEQUENCE_NUMBER."""
    import uuid

    from mink.storage.log import (
        OutOfOrderSequence,
        PartitionLog,
        StorageUnavailable,
    )
    from mink.storage.producer_state import RefusedSequences

    refused = RefusedSequences()
    log_ = PartitionLog(uuid.uuid4(), 0, 0, 0, 0, _HeldWal(), None, refused)
    _append(log_, 9, 0, 0)
    log_.frozen = True  # an in-doubt commit: sequence 1 is refused, not written
    try:
        _append(log_, 9, 0, 1)
    except StorageUnavailable:
        pass
    else:
        raise AssertionError("a frozen partition took a batch")
    log_.frozen = False
    for behind in (2, 3):  # pipelined behind sequence 1: retriable, never written
        try:
            _append(log_, 9, 0, behind)
        except StorageUnavailable:
            pass
        else:
            raise AssertionError(f"sequence {behind} written over the gap at 1")
    _append(log_, 9, 0, 1)  # the client re-sends in order: all written
    _append(log_, 9, 0, 2)
    try:  # a gap this node did not make
        _append(log_, 9, 0, 7)
    except OutOfOrderSequence:
        pass
    else:
        raise AssertionError("a real gap was not OUT_OF_ORDER_SEQUENCE_NUMBER")

    # Appends failed after they were taken (a failed upload resets the log) count too,
    # and are remembered by the log that follows on the same node (a new leader epoch).
    pending = _append(log_, 9, 0, 3)
    log_.reset(StorageUnavailable("upload failed"), from_offset=pending.base_offset)
    reopened = PartitionLog(log_.topic_id, 0, 1, 3, 0, _HeldWal(), None, refused)
    reopened.producers.load([_entry(9, 0, 2)])  # what PostgreSQL had: 0-2 committed
    try:
        _append(reopened, 9, 0, 4)
    except StorageUnavailable:
        pass
    else:
        raise AssertionError("sequence 4 written over the gap at 3")
    _append(reopened, 9, 0, 3)
    _append(reopened, 9, 0, 4)
    assert len(refused) == 0


def _entry(producer_id: int, epoch: int, last_seq: int):
    from mink.storage.producer_state import BatchMetadata, ProducerEntry

    entry = ProducerEntry(producer_id, epoch, last_update_ms=int(time.time() * 1000))
    entry.batches.append(BatchMetadata(last_seq, last_seq, last_seq, last_seq))
    return entry

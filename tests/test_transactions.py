"""Transactions and exactly-once with stock clients (confluent-kafka's transactional
producer, kafka-python's), against real nodes on PostgreSQL and the file:// store; the pure
rules of the coordinator's state machine."""

from __future__ import annotations

import time
import uuid

import pytest
import trio
from kio.schema.errors import ErrorCode

from mink.broker.transactions import state as rules

TIMEOUT = 60
TOPIC_PARTITIONS = 3


@pytest.fixture
def node_settings() -> dict:
    return dict(num_partitions=TOPIC_PARTITIONS, offsets_topic_num_partitions=3,
                transaction_state_num_partitions=3, group_initial_rebalance_delay_ms=0,
                transaction_abort_timed_out_transaction_cleanup_interval_ms=500)


def txn_producer(address: str, transactional_id: str, **conf):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "transactional.id": transactional_id,
                         "linger.ms": 5, **conf})
    producer.init_transactions(TIMEOUT)
    return producer


def consume_all(address: str, topic: str, isolation: str, partitions: int = TOPIC_PARTITIONS,
                expected: int | None = None, idle_s: float = 3.0) -> list:
    """Every message of the topic under `isolation`: until `expected` arrived, or until
    nothing came for idle_s after the consumer reached the end it sees."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": address, "group.id": f"check-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out, eof = [], set()
    deadline = time.monotonic() + TIMEOUT
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            if expected is not None and len(out) >= expected:
                break
            msg = consumer.poll(0.2)
            if msg is None:
                if expected is None and len(eof) == partitions and (
                        time.monotonic() - last > idle_s):
                    break
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    eof.add(msg.partition())
                    continue
                raise AssertionError(msg.error())
            last = time.monotonic()
            eof.discard(msg.partition())
            out.append(msg)
    finally:
        consumer.close()
    return out


def values(messages) -> list[bytes]:
    return sorted(m.value() for m in messages)


async def test_committed_visible_aborted_never_whole_or_nothing(node):
    def run():
        producer = txn_producer(node, "txn-basic")
        producer.begin_transaction()
        for i in range(30):
            producer.produce("txn", value=b"committed-%d" % i, partition=i % 3)
        producer.commit_transaction(TIMEOUT)
        producer.begin_transaction()
        for i in range(30):
            producer.produce("txn", value=b"aborted-%d" % i, partition=i % 3)
        producer.flush(TIMEOUT)  # written to the log, then aborted
        producer.abort_transaction(TIMEOUT)
        producer.begin_transaction()
        for i in range(6):
            producer.produce("txn", value=b"second-%d" % i, partition=i % 3)
        producer.commit_transaction(TIMEOUT)
        committed = consume_all(node, "txn", "read_committed")  # until idle at the end
        time.sleep(1)
        uncommitted = consume_all(node, "txn", "read_uncommitted", expected=66)
        return committed, uncommitted

    committed, uncommitted = await trio.to_thread.run_sync(run)
    assert values(committed) == sorted([b"committed-%d" % i for i in range(30)]
                                       + [b"second-%d" % i for i in range(6)])
    assert len(uncommitted) == 66, "read_uncommitted sees both, control batches skipped"
    assert {m.value()[:7] for m in uncommitted} == {b"committ", b"aborted", b"second-"}


async def test_zombie_with_the_older_epoch_is_fenced(node):
    from confluent_kafka import KafkaException

    def run():
        zombie = txn_producer(node, "txn-zombie")
        zombie.begin_transaction()
        zombie.produce("fenced", value=b"zombie-open", partition=0)
        zombie.flush(TIMEOUT)
        # A new instance with the same transactional id: the epoch is bumped, the zombie's
        # open transaction is aborted first.
        successor = txn_producer(node, "txn-zombie")
        successor.begin_transaction()
        successor.produce("fenced", value=b"successor", partition=1)
        successor.commit_transaction(TIMEOUT)
        zombie.produce("fenced", value=b"zombie-late", partition=2)
        with pytest.raises(KafkaException) as raised:
            zombie.commit_transaction(TIMEOUT)
        return raised.value.args[0], consume_all(node, "fenced", "read_committed"), (
            consume_all(node, "fenced", "read_uncommitted"))

    error, committed, uncommitted = await trio.to_thread.run_sync(run)
    assert error.fatal() or error.txn_requires_abort(), error
    assert "fenced" in error.str().lower() or "epoch" in error.str().lower(), error
    assert values(committed) == [b"successor"]
    assert b"zombie-late" not in values(uncommitted), "the fenced epoch wrote nothing more"
    assert b"zombie-open" in values(uncommitted), "it was written, then aborted"


async def test_transaction_timeout_above_the_maximum_is_refused(node):
    from confluent_kafka import KafkaException, Producer

    def run():
        producer = Producer({"bootstrap.servers": node, "transactional.id": "txn-long",
                             "transaction.timeout.ms": 900_001})
        with pytest.raises(KafkaException) as raised:
            producer.init_transactions(TIMEOUT)
        return raised.value.args[0]

    error = await trio.to_thread.run_sync(run)
    assert error.code() == ErrorCode.invalid_transaction_timeout, error


async def test_open_transaction_holds_the_lso_until_its_timeout_aborts_it(node):
    from confluent_kafka import KafkaException

    from tests.test_interop import confluent_produce

    def run():
        producer = txn_producer(node, "txn-timeout", **{"transaction.timeout.ms": 3000})
        producer.begin_transaction()
        producer.produce("lso", value=b"left-open", partition=0)
        producer.flush(TIMEOUT)
        opened = time.monotonic()
        confluent_produce(node, "lso", [{"value": b"after", "partition": 0}])
        # Held back: the non-transactional record after the open transaction is not
        # visible to read_committed until the transaction ends.
        held = consume_all(node, "lso", "read_committed", partitions=1, idle_s=1.0)
        held_for = time.monotonic() - opened
        released = consume_all(node, "lso", "read_committed", partitions=1, expected=1)
        waited = time.monotonic() - opened
        with pytest.raises(KafkaException):
            producer.commit_transaction(TIMEOUT)
        everything = consume_all(node, "lso", "read_uncommitted", partitions=1, expected=2)
        return held, held_for, released, waited, everything

    held, held_for, released, waited, everything = await trio.to_thread.run_sync(run)
    assert held == [] or held_for >= 3.0, "nothing past the open transaction before its timeout"
    assert values(released) == [b"after"], "aborted by the timeout: the LSO moved on"
    assert waited < 20, waited
    assert values(everything) == [b"after", b"left-open"]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
async def test_consume_transform_produce_with_offsets_in_the_transaction(node, protocol):
    """With a classic group and with a KIP-848 consumer group (its member epoch is the
    generation TxnOffsetCommit checks)."""
    from confluent_kafka import Consumer, TopicPartition

    from tests.test_interop import confluent_produce

    n = 300

    def run():
        confluent_produce(node, "ctp-in", [{"value": b"%d" % i, "partition": i % 3}
                                          for i in range(n)])
        consumer = Consumer({"bootstrap.servers": node, "group.id": "ctp",
                             "group.protocol": protocol,
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "isolation.level": "read_committed"})
        consumer.subscribe(["ctp-in"])
        producer = txn_producer(node, "txn-ctp")
        seen, rounds, aborted_once = 0, 0, False
        deadline = time.monotonic() + TIMEOUT
        while seen < n and time.monotonic() < deadline:
            batch = consumer.consume(50, 1.0)
            batch = [m for m in batch if not m.error()]
            if not batch:
                continue
            producer.begin_transaction()
            for m in batch:
                producer.produce("ctp-out", value=b"out-" + m.value(), partition=m.partition())
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), TIMEOUT)
            rounds += 1
            if rounds == 2 and not aborted_once:
                # Aborted: neither its output nor its offsets count; read it again.
                producer.abort_transaction(TIMEOUT)
                aborted_once = True
                committed = consumer.committed(consumer.assignment(), TIMEOUT)
                for tp in committed:
                    consumer.seek(TopicPartition(tp.topic, tp.partition,
                                                 tp.offset if tp.offset >= 0 else 0))
                continue
            producer.commit_transaction(TIMEOUT)
            seen += len(batch)
        final = consumer.committed([TopicPartition("ctp-in", p) for p in range(3)], TIMEOUT)
        consumer.close()
        return seen, aborted_once, final, consume_all(node, "ctp-out", "read_committed")

    seen, aborted_once, final, output = await trio.to_thread.run_sync(run)
    assert aborted_once
    assert seen == n
    assert values(output) == sorted(b"out-%d" % i for i in range(n)), "each exactly once"
    assert sorted(tp.offset for tp in final) == [n // 3] * 3, "the offsets went with the output"


async def test_kafka_python_transactions(node):
    def run():
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=node, transactional_id="txn-kafka-python")
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(5):
            producer.send("kp", value=b"kept-%d" % i, partition=i % 3)
        producer.commit_transaction()
        producer.begin_transaction()
        for i in range(5):
            producer.send("kp", value=b"dropped-%d" % i, partition=i % 3)
        producer.flush()
        producer.abort_transaction()
        producer.close()
        return consume_all(node, "kp", "read_committed")

    committed = await trio.to_thread.run_sync(run)
    assert values(committed) == sorted(b"kept-%d" % i for i in range(5))


# -- the protocol level: verification (KIP-890 part 1), states, errors -----------------------


def _txn_requests():
    import datetime

    from kio.index import load_request_schema

    from mink.protocol.messages import build, nested

    def init(txn_id: str, timeout_ms: int = 60_000):
        return build(load_request_schema(22, 4), transactional_id=txn_id,
                     transaction_timeout=datetime.timedelta(milliseconds=timeout_ms),
                     producer_id=-1, producer_epoch=-1)

    def add(txn_id: str, pid: int, epoch: int, topic: str, partitions: list[int]):
        schema = load_request_schema(24, 3)
        return build(schema, v3_and_below_transactional_id=txn_id,
                     v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                     v3_and_below_topics=(build(nested(schema, "AddPartitionsToTxnTopic"),
                                                name=topic, partitions=tuple(partitions)),))

    def end(txn_id: str, pid: int, epoch: int, commit: bool):
        return build(load_request_schema(26, 3), transactional_id=txn_id, producer_id=pid,
                     producer_epoch=epoch, committed=commit)

    def list_latest(topic: str, isolation: int):
        schema = load_request_schema(2, 7)
        partition = build(nested(schema, "ListOffsetsPartition"), partition_index=0,
                          current_leader_epoch=-1, timestamp=-1)
        return build(schema, replica_id=-1, isolation_level=isolation, topics=(
            build(nested(schema, "ListOffsetsTopic"), name=topic, partitions=(partition,)),))

    return init, add, end, list_latest


def _transactional_produce(topic: str, txn_id: str, pid: int, epoch: int, seq: int,
                           value: bytes):
    from mink.protocol.records import Record, build_batch
    from tests.support.raw import produce_request

    import dataclasses

    batch = build_batch([Record(0, 0, None, value)], producer_id=pid, producer_epoch=epoch,
                        base_sequence=seq, is_transactional=True)
    return dataclasses.replace(produce_request(topic, 0, batch), transactional_id=txn_id)


async def test_a_transactional_batch_after_its_abort_is_refused_and_the_lso_moves(node):
    from mink.client import KafkaClient
    from mink.protocol.records import Record, build_batch
    from tests.support.raw import produce_request, produce_result

    init, add, end, list_latest = _txn_requests()
    client = await KafkaClient.connect(node)
    try:
        with trio.fail_after(TIMEOUT):
            while True:  # the first lookup creates __transaction_state
                answer = await client.call(22, 4, init("kip890"))
                if answer.error_code == ErrorCode.none:
                    break
                assert answer.error_code in (ErrorCode.coordinator_not_available,
                                             ErrorCode.not_coordinator,
                                             ErrorCode.coordinator_load_in_progress), answer
                await trio.sleep(0.1)
        pid, epoch = answer.producer_id, answer.producer_epoch
        await client.call(0, 9, produce_request("v890", 0, build_batch([Record(0, 0, None,
                                                                              b"plain")])))

        async def produce(seq: int, value: bytes) -> tuple[int, int]:
            return produce_result(await client.call(0, 9, _transactional_produce(
                "v890", "kip890", pid, epoch, seq, value)))

        async def latest(isolation: int) -> int:
            response = await client.call(2, 7, list_latest("v890", isolation))
            return response.topics[0].partitions[0].offset

        # Not added to the transaction: refused, the partition is not opened to it.
        assert (await produce(0, b"unlisted"))[0] == ErrorCode.invalid_txn_state
        assert (await client.call(24, 3, add("kip890", pid, epoch, "v890", [0]))
                ).results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code \
            == ErrorCode.none
        assert await produce(0, b"in-transaction") == (ErrorCode.none, 1)
        assert await latest(1) == 1 and await latest(0) == 2, "the LSO stops at the open one"
        assert (await client.call(26, 3, end("kip890", pid, epoch, False))).error_code == 0
        with trio.fail_after(TIMEOUT):  # the abort marker is written, the LSO moves on
            while await latest(1) != 3:
                await trio.sleep(0.05)
        # A delayed or retried Produce of the aborted transaction arriving now: refused, no
        # transaction is opened again, the LSO stays at the end.
        assert (await produce(1, b"late"))[0] == ErrorCode.invalid_txn_state
        assert await latest(1) == await latest(0) == 3
        # EndTxn again: the outcome asked for is the one reached.
        assert (await client.call(26, 3, end("kip890", pid, epoch, False))).error_code == 0
        assert (await client.call(26, 3, end("kip890", pid, epoch, True))).error_code == (
            ErrorCode.invalid_txn_state)
        assert (await client.call(26, 3, end("kip890", pid, epoch + 1, True))).error_code == (
            ErrorCode.producer_fenced)
    finally:
        await client.aclose()


# -- the rules, row by row --------------------------------------------------------------------

T = uuid.uuid4()


def stored(state, epoch=3, partitions=()):
    return rules.Stored(7, epoch, 60_000, state, frozenset(partitions))


@pytest.mark.parametrize("state, error, write_state, epoch", [
    (None, ErrorCode.none, rules.EMPTY, 0),
    (rules.EMPTY, ErrorCode.none, rules.EMPTY, 4),
    (rules.COMPLETE_COMMIT, ErrorCode.none, rules.EMPTY, 4),
    (rules.COMPLETE_ABORT, ErrorCode.none, rules.EMPTY, 4),
    (rules.ONGOING, ErrorCode.concurrent_transactions, rules.PREPARE_ABORT, 4),
    (rules.PREPARE_COMMIT, ErrorCode.concurrent_transactions, None, None),
    (rules.PREPARE_ABORT, ErrorCode.concurrent_transactions, None, None),
])
def test_init_producer_id_rules(state, error, write_state, epoch):
    decision = rules.init_producer_id(None if state is None else stored(state), 1000)
    assert decision.error == error
    assert (decision.write.state if decision.write else None) == write_state
    assert (decision.write.producer_epoch if decision.write else None) == epoch


def test_epoch_exhausted_takes_a_new_producer_id_and_kip360_checks_the_caller():
    decision = rules.init_producer_id(stored(rules.EMPTY, epoch=rules.MAX_EPOCH - 1), 1000)
    assert decision.write.producer_id == rules.NEW_PRODUCER_ID and decision.answer[1] == 0
    assert rules.init_producer_id(stored(rules.EMPTY), 1000, 7, 2).error == (
        ErrorCode.producer_fenced)
    assert rules.init_producer_id(stored(rules.EMPTY), 1000, 7, 3).write.producer_epoch == 4


@pytest.mark.parametrize("state, commit, error, write_state", [
    (rules.ONGOING, True, ErrorCode.none, rules.PREPARE_COMMIT),
    (rules.ONGOING, False, ErrorCode.none, rules.PREPARE_ABORT),
    (rules.PREPARE_COMMIT, True, ErrorCode.concurrent_transactions, None),
    (rules.PREPARE_COMMIT, False, ErrorCode.invalid_txn_state, None),
    (rules.PREPARE_ABORT, False, ErrorCode.concurrent_transactions, None),
    (rules.COMPLETE_COMMIT, True, ErrorCode.none, None),
    (rules.COMPLETE_COMMIT, False, ErrorCode.invalid_txn_state, None),
    (rules.COMPLETE_ABORT, False, ErrorCode.none, None),
    (rules.EMPTY, True, ErrorCode.invalid_txn_state, None),
])
def test_end_txn_rules(state, commit, error, write_state):
    decision = rules.end_txn(stored(state), 7, 3, commit)
    assert decision.error == error
    assert (decision.write.state if decision.write else None) == write_state


def test_add_partitions_and_timeout_rules():
    assert rules.add_partitions(None, 7, 3, {(T, 0)}).error == (
        ErrorCode.invalid_producer_id_mapping)
    assert rules.add_partitions(stored(rules.EMPTY), 7, 2, {(T, 0)}).error == (
        ErrorCode.producer_fenced)
    assert rules.add_partitions(stored(rules.PREPARE_ABORT), 7, 3, {(T, 0)}).error == (
        ErrorCode.concurrent_transactions)
    assert rules.add_partitions(stored(rules.ONGOING, partitions=[(T, 0)]), 7, 3,
                                {(T, 0)}).write is None
    decision = rules.add_partitions(stored(rules.COMPLETE_COMMIT), 7, 3, {(T, 0), (T, 1)})
    assert decision.write.state == rules.ONGOING and set(decision.write.add) == {(T, 0), (T, 1)}
    timed_out = rules.abort_timed_out(stored(rules.ONGOING))
    assert timed_out.write.state == rules.PREPARE_ABORT and timed_out.write.producer_epoch == 4
    assert rules.abort_timed_out(stored(rules.COMPLETE_ABORT)).write is None
    assert rules.verify_partitions(stored(rules.ONGOING, partitions=[(T, 0)]), 7, 3,
                                   {(T, 0)}) == ErrorCode.none
    assert rules.verify_partitions(stored(rules.COMPLETE_ABORT), 7, 3, {(T, 0)}) == (
        ErrorCode.invalid_txn_state)


async def test_aborted_transactions_stay_hidden_after_a_restart(mink_postgres, store_url):
    """The aborted-transaction index is read back from PostgreSQL by the reopened partition
    (the node's memory of its aborts is gone), and the LSO comes back with the producer
    states: a transaction left open across the restart still holds read_committed back."""
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         num_partitions=1, transaction_state_num_partitions=1) as node:
        def before():
            producer = txn_producer(node.bootstrap, "txn-restart")
            for kind in (b"kept", b"dropped", b"kept-too"):
                producer.begin_transaction()
                for i in range(5):
                    producer.produce("restart", value=kind + b"-%d" % i, partition=0)
                producer.flush(TIMEOUT)
                if kind == b"dropped":
                    producer.abort_transaction(TIMEOUT)
                else:
                    producer.commit_transaction(TIMEOUT)
            opener = txn_producer(node.bootstrap, "txn-left-open")
            opener.begin_transaction()
            opener.produce("restart", value=b"open", partition=0)
            opener.flush(TIMEOUT)
            return consume_all(node.bootstrap, "restart", "read_committed", partitions=1,
                               expected=10)

        first = await trio.to_thread.run_sync(before)
        await node.restart()
        after = await trio.to_thread.run_sync(lambda: consume_all(
            node.bootstrap, "restart", "read_committed", partitions=1))
        everything = await trio.to_thread.run_sync(lambda: consume_all(
            node.bootstrap, "restart", "read_uncommitted", partitions=1, expected=16))
    kept = sorted([b"kept-%d" % i for i in range(5)] + [b"kept-too-%d" % i for i in range(5)])
    assert values(first) == kept
    assert values(after) == kept, "no aborted record, nothing past the open transaction"
    assert len(everything) == 16


# -- admin: DescribeTransactions, ListTransactions, DescribeProducers (KIP-664) --------------


async def test_admin_clients_describe_and_list_transactions_and_producers(node):
    import kafka.errors
    from kafka import KafkaAdminClient, TopicPartition

    def run():
        open_one = txn_producer(node, "txn-admin-open")
        open_one.begin_transaction()
        open_one.produce("adm", value=b"open", partition=1)
        open_one.flush(TIMEOUT)  # written, the transaction stays open
        done = txn_producer(node, "txn-admin-done")
        done.begin_transaction()
        done.produce("adm", value=b"done", partition=0)
        done.commit_transaction(TIMEOUT)
        admin = KafkaAdminClient(bootstrap_servers=node)
        try:
            # As in Kafka, EndTxn is answered once PrepareCommit is stored; the markers and
            # CompleteCommit follow: a describe right after the commit may see PrepareCommit.
            deadline = time.monotonic() + TIMEOUT
            while _field(admin.describe_transactions(["txn-admin-done"])["txn-admin-done"],
                         "state") != "CompleteCommit":
                assert time.monotonic() < deadline, "the commit never completed"
                time.sleep(0.05)
            described = admin.describe_transactions(["txn-admin-open", "txn-admin-done"])
            listed = _flat(admin.list_transactions())
            ongoing = _flat(admin.list_transactions(state_filters=["Ongoing"]))
            long_running = _flat(admin.list_transactions(duration_filter_ms=3_600_000))
            open_pid = described["txn-admin-open"].producer_id
            by_pid = _flat(admin.list_transactions(producer_id_filters=[open_pid]))
            producers = admin.describe_producers([TopicPartition("adm", 1),
                                                  TopicPartition("adm", 0)])
            with pytest.raises(kafka.errors.TransactionalIdNotFoundError):
                admin.describe_transactions(["txn-admin-never"])
        finally:
            admin.close()
        open_one.abort_transaction(TIMEOUT)
        return described, listed, ongoing, long_running, by_pid, producers

    described, listed, ongoing, long_running, by_pid, producers = (
        await trio.to_thread.run_sync(run))
    opened, done = described["txn-admin-open"], described["txn-admin-done"]
    assert _field(opened, "state") == "Ongoing", opened
    assert {(t, tuple(p)) for t, p in _topics_of(opened)} == {("adm", (1,))}, opened
    assert opened.transaction_start_time_ms > 0 and opened.transaction_timeout_ms == 60_000
    assert _field(done, "state") == "CompleteCommit" and not _topics_of(done), done
    states = {_field(t, "transactional_id"): _field(t, "state") for t in listed}
    assert states["txn-admin-open"] == "Ongoing"
    assert states["txn-admin-done"] == "CompleteCommit"
    assert [_field(t, "transactional_id") for t in ongoing] == ["txn-admin-open"]
    assert not [t for t in long_running if _field(t, "transactional_id") == "txn-admin-open"]
    assert [_field(t, "transactional_id") for t in by_pid] == ["txn-admin-open"]
    active = {tp.partition: state for tp, state in producers.items()}
    open_state = [p for p in _producers_of(active[1]) if _field(p, "producer_id") == (
        opened.producer_id)]
    assert open_state and _field(open_state[0], "current_transaction_start_offset") >= 0, active[1]
    done_state = [p for p in _producers_of(active[0]) if _field(p, "producer_id") == (
        done.producer_id)]
    assert done_state and _field(done_state[0], "current_transaction_start_offset") == -1, active[0]


def _field(item, name: str):
    value = item[name] if isinstance(item, dict) else getattr(item, name)
    return getattr(value, "value", value)  # kafka-python's TransactionState enum


def _flat(by_broker: dict) -> list:
    return [listing for listings in by_broker.values() for listing in listings]


def _topics_of(description) -> list:
    topics = description.topic_partitions
    out: dict[str, list[int]] = {}
    for tp in topics:
        out.setdefault(tp.topic, []).append(tp.partition)
    return [(t, sorted(p)) for t, p in out.items()]


def _producers_of(state) -> list:
    return list(_field(state, "active_producers"))


async def test_list_transactions_reports_unknown_state_filters_and_unknown_partitions(node):
    from kio.index import load_request_schema

    from mink.client import KafkaClient
    from mink.protocol.messages import build, nested

    client = await KafkaClient.connect(node)
    try:
        listed = await client.call(66, 1, build(load_request_schema(66, 1),
                                                state_filters=("Bogus",),
                                                producer_id_filters=(), duration_filter=-1))
        assert listed.error_code == ErrorCode.none
        assert listed.unknown_state_filters == ("Bogus",)
        schema = load_request_schema(61, 0)
        producers = await client.call(61, 0, build(schema, topics=(build(
            nested(schema, "TopicRequest"), name="no-such-topic", partition_indexes=(0,)),)))
        assert producers.topics[0].partitions[0].error_code == (
            ErrorCode.unknown_topic_or_partition)
        described = await client.call(65, 0, build(load_request_schema(65, 0),
                                                   transactional_ids=("",)))
        assert described.transaction_states[0].error_code != ErrorCode.none
    finally:
        await client.aclose()


async def test_idle_transactional_ids_expire(mink_postgres, store_url):
    """transactional.id.expiration.ms: an id idle longer is removed by its coordinator; an
    open transaction is never expired; an expired id starts afresh at InitProducerId."""
    import psycopg

    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         num_partitions=1, transaction_state_num_partitions=1,
                         transactional_id_expiration_ms=1500,
                         transaction_remove_expired_transaction_cleanup_interval_ms=200
                         ) as running:
        address = running.bootstrap

        def ids() -> set[str]:
            with psycopg.connect(running.cluster.postgres_url, autocommit=True) as conn:
                return {r[0] for r in conn.execute(
                    "SELECT transactional_id FROM transactions").fetchall()}

        def run():
            idle = txn_producer(address, "txn-idle")
            idle.begin_transaction()
            idle.produce("exp", value=b"kept", partition=0)
            idle.commit_transaction(TIMEOUT)
            busy = txn_producer(address, "txn-busy", **{"transaction.timeout.ms": 60_000})
            busy.begin_transaction()
            busy.produce("exp", value=b"open", partition=0)
            busy.flush(TIMEOUT)  # its transaction stays open past the expiration
            assert ids() >= {"txn-idle", "txn-busy"}
            deadline = time.monotonic() + TIMEOUT
            while "txn-idle" in ids():
                assert time.monotonic() < deadline, "the idle id was never expired"
                time.sleep(0.1)
            assert "txn-busy" in ids(), "an open transaction is not expired"
            busy.commit_transaction(TIMEOUT)
            # The expired id starts afresh: a new producer id, epoch 0.
            again = txn_producer(address, "txn-idle")
            again.begin_transaction()
            again.produce("exp", value=b"again", partition=0)
            again.commit_transaction(TIMEOUT)
            return consume_all(address, "exp", "read_committed", partitions=1, expected=3)

        committed = await trio.to_thread.run_sync(run)
        assert values(committed) == [b"again", b"kept", b"open"]


async def test_kafkajs_transactions(node, kafkajs_modules):
    """kafkajs' transactional producer (commit, abort, commit) and its read_committed
    consumer: only the committed values arrive."""
    import json
    import os
    import subprocess
    from pathlib import Path

    script = Path(__file__).parent / "node" / "kafkajs_transactions.js"

    def run():
        env = dict(os.environ, NODE_PATH=str(kafkajs_modules / "node_modules"))
        done = subprocess.run(["node", str(script), node, "kjs"], capture_output=True,
                              text=True, timeout=150, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])["consumed"]

    consumed = await trio.to_thread.run_sync(run)
    expected = [b"committed-%d" % i for i in range(6)] + [b"second-%d" % i for i in range(3)]
    assert sorted(v.encode() for v in consumed) == sorted(expected)
    uncommitted = await trio.to_thread.run_sync(
        lambda: consume_all(node, "kjs", "read_uncommitted", expected=15))
    assert len(uncommitted) == 15, "the aborted ones were written, then aborted"


async def test_a_marker_whose_commit_is_slow_is_not_written_twice(mink_postgres, store_url,
                                                                    monkeypatch):
    """A marker append still in doubt when the writer's wait ends (its WAL commit slow) stays
    in flight until its outcome is known: looked for again meanwhile, its row still pending,
    it was appended a second time (a duplicate marker, seen once under load)."""
    from mink.broker.transactions import markers
    from mink.storage.controlplane.postgres import READ
    from mink.testing import open_node

    monkeypatch.setattr(markers, "WRITE_TIMEOUT_S", 0.1)
    async with open_node(mink_postgres, store_url=store_url, proxy=False, num_partitions=1,
                         transaction_state_num_partitions=1) as node:
        producer = await trio.to_thread.run_sync(txn_producer, node.bootstrap, "txn-slow")

        def write():
            producer.begin_transaction()
            for i in range(5):
                producer.produce("slow", value=b"v-%d" % i, partition=0)
            producer.flush(TIMEOUT)

        await trio.to_thread.run_sync(write)
        node.delay_commits(1.5)  # the marker's commit: past the writer's wait, many rounds
        await trio.to_thread.run_sync(producer.commit_transaction, TIMEOUT)

        async def state():
            return await node.call(node.node.metadata.fetch_one, READ, """
                SELECT (SELECT count(*) FROM txn_markers), p.committed_end
                  FROM partitions p JOIN topics t USING (topic_id) WHERE t.name = 'slow'""")

        with trio.fail_after(30):
            while (await state())[0] != 0:
                await trio.sleep(0.1)
        node.delay_commits(0)

        def one_more():  # acknowledged after every earlier append of the node resolved
            from confluent_kafka import Producer

            plain = Producer({"bootstrap.servers": node.bootstrap})
            plain.produce("slow", value=b"after", partition=0)
            assert plain.flush(TIMEOUT) == 0

        await trio.to_thread.run_sync(one_more)
        assert (await state())[1] == 7, "5 records, one marker, the record after"

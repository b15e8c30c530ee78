"""Exactly-once under SIGKILL: a consume-transform-produce loop (confluent-kafka: a
read_committed group consumer, a transactional producer, `send_offsets_to_transaction`)
over MINK_EOS_MESSAGES input messages (5,000 by default; `benchmarks/eos_kill.py` runs it
with 100,000), while, in turn, the node leading the output partition, the transaction
coordinator's node and the group coordinator's node are SIGKILLed (and restarted). The
output holds every input exactly once; the committed input offsets are the input's ends.

Three `mink serve` subprocesses on PostgreSQL and S3 (moto)."""

from __future__ import annotations

import collections
import os
import threading
import time

from tests.support.cluster import cluster  # noqa: F401  (fixture)
from tests.test_interop import confluent_produce
from tests.test_transactions import consume_all

PARTITIONS = 3
SETTINGS = dict(num_partitions=PARTITIONS, transaction_state_num_partitions=1,
                offsets_topic_num_partitions=1, group_initial_rebalance_delay_ms=0)
BATCH = 500
LOOP_TIMEOUT = 60


def _messages() -> int:
    return int(os.environ.get("MINK_EOS_MESSAGES", "5000"))


class Loop:
    """The consume-transform-produce loop, in a thread: each input batch is produced to
    eos-out and its offsets committed in one transaction; an abortable error aborts and
    rewinds to the committed offsets, a fatal one starts a new producer (which fences the
    old)."""

    def __init__(self, bootstrap: str, total: int):
        self.bootstrap = bootstrap
        self.total = total
        self.committed = 0  # input messages whose transaction committed
        self.allowed = 0  # the test lets the loop go this far, so that kills land mid-run
        self.aborts = 0
        self.new_producers = 0
        self.error: BaseException | None = None
        self.done = threading.Event()

    def _producer(self):
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": "eos-loop",
                             "linger.ms": 5, "transaction.timeout.ms": 30_000})
        producer.init_transactions(LOOP_TIMEOUT)
        return producer

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.done.set()

    def _rewind(self, consumer) -> None:
        from confluent_kafka import OFFSET_BEGINNING

        assignment = consumer.assignment()
        for tp in consumer.committed(assignment, timeout=LOOP_TIMEOUT):
            tp.offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            consumer.seek(tp)

    def _run(self) -> None:
        from confluent_kafka import Consumer, KafkaException

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "eos",
                             "isolation.level": "read_committed",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "session.timeout.ms": 10_000})
        consumer.subscribe(["eos-in"])
        producer = self._producer()
        deadline = time.monotonic() + 600
        try:
            while self.committed < self.total and not (self.allowed == 0 and self.committed):
                assert time.monotonic() < deadline, "the loop made no end"
                room = min(BATCH, self.allowed - self.committed)
                if room <= 0:
                    time.sleep(0.05)  # the test has not let it on (poll() would consume)
                    continue
                batch = [m for m in consumer.consume(room, 1.0) if not m.error()]
                if not batch:
                    continue
                try:
                    producer.begin_transaction()
                    for m in batch:
                        producer.produce("eos-out", value=m.value(), partition=m.partition())
                    producer.send_offsets_to_transaction(
                        consumer.position(consumer.assignment()),
                        consumer.consumer_group_metadata(), LOOP_TIMEOUT)
                    self._commit(producer)
                    self.committed += len(batch)
                except KafkaException as exc:
                    error = exc.args[0]
                    if error.fatal():
                        self.new_producers += 1
                        producer = self._producer()
                    else:
                        self.aborts += 1
                        try:
                            producer.abort_transaction(LOOP_TIMEOUT)
                        except KafkaException as again:
                            if not again.args[0].fatal():
                                raise
                            self.new_producers += 1
                            producer = self._producer()
                    self._rewind(consumer)
        finally:
            consumer.close()

    @staticmethod
    def _commit(producer) -> None:
        from confluent_kafka import KafkaException

        while True:
            try:
                producer.commit_transaction(LOOP_TIMEOUT)
                return
            except KafkaException as exc:
                if exc.args[0].retriable():
                    continue  # the outcome is not known yet: commit again
                raise


def test_consume_transform_produce_exactly_once_across_kills(cluster):  # noqa: F811
    total = _messages()
    for node_id in (1, 2, 3):
        cluster.start(node_id, **SETTINGS)
    values = [b"%d" % i for i in range(total)]
    for start in range(0, total, 10_000):
        confluent_produce(cluster.bootstrap, "eos-in", [
            {"value": v, "partition": int(v) % PARTITIONS} for v in values[start:start + 10_000]])
    loop = Loop(cluster.bootstrap, total)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    kills = []
    started = time.monotonic()
    try:
        # Each kill lands while the loop still has a tenth of the input to go through it.
        for share, victim in ((0.2, lambda: cluster.leaders("eos-out")[0][0]),
                              (0.45, lambda: cluster.leaders("__transaction_state")[0][0]),
                              (0.7, lambda: cluster.leaders("__consumer_offsets")[0][0])):
            loop.allowed = int((share + 0.1) * total)
            cluster.wait_for(lambda: loop.committed >= share * total or loop.done.is_set(),
                             timeout=300, what=f"{share:.0%} of the input committed")
            assert loop.error is None, loop.error
            node_id = victim()
            cluster.nodes[node_id].kill()
            kills.append((round(time.monotonic() - started, 1), node_id, loop.committed))
            time.sleep(1.0)
            cluster.start(node_id, **SETTINGS)
            cluster.wait_for(lambda: loop.committed >= loop.allowed or loop.done.is_set(),
                             timeout=300, what="the loop going on through the failure")
            assert loop.error is None, loop.error
        loop.allowed = total
        assert loop.done.wait(600), f"the loop did not finish: {loop.committed}/{total}"
        assert loop.error is None, loop.error
    finally:
        loop.allowed = 0  # stops the loop if still running
        thread.join(120)
    elapsed = time.monotonic() - started
    out = consume_all(cluster.bootstrap, "eos-out", "read_committed", partitions=PARTITIONS,
                      expected=total, idle_s=5.0)
    # a few seconds more: nothing beyond `total` may arrive
    extra = consume_all(cluster.bootstrap, "eos-out", "read_committed", partitions=PARTITIONS)
    counts = collections.Counter(m.value() for m in extra)
    duplicates = {v: c for v, c in counts.items() if c > 1}
    missing = set(values) - set(counts)
    print(f"\nEOS: {total} messages in {elapsed:.1f}s, kills (s, node, committed): {kills}, "
          f"aborts {loop.aborts}, new producers {loop.new_producers}, "
          f"output {len(extra)}, duplicates {len(duplicates)}, missing {len(missing)}")
    assert len(out) >= total
    assert not duplicates, list(duplicates.items())[:5]
    assert not missing, sorted(missing)[:5]
    assert len(extra) == total
    committed = dict(cluster.query(
        "SELECT partition, committed_offset FROM group_offsets WHERE group_id = 'eos' "
        "AND topic = 'eos-in'"))
    ends = dict(cluster.query("SELECT p.partition, p.committed_end FROM partitions p JOIN "
                              "topics t USING (topic_id) WHERE t.name = 'eos-in'"))
    assert committed == ends, (committed, ends)
    assert len(kills) == 3, kills

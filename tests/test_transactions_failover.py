"""Transactions across failures, with nodes as subprocesses on PostgreSQL and S3 (moto):
markers a killed leader left pending are written by the partition's next leader; a
transaction whose coordinator is killed is finished by the next one."""

from __future__ import annotations

import os
import signal

from tests.support.cluster import cluster  # noqa: F401  (fixture)
from tests.test_interop import confluent_produce
from tests.test_transactions import TIMEOUT, consume_all, txn_producer, values

SETTINGS = dict(num_partitions=2, transaction_state_num_partitions=1,
                offsets_topic_num_partitions=1, group_initial_rebalance_delay_ms=0)


def _start(cluster):
    for node_id in (1, 2):
        cluster.start(node_id, **SETTINGS)
    producer = txn_producer(cluster.bootstrap, "failover")  # creates __transaction_state
    coordinator = cluster.wait_for(
        lambda: cluster.leaders("__transaction_state").get(0, (None, 0))[0],
        what="the transaction coordinator")
    confluent_produce(cluster.bootstrap, "fo", [{"value": b"plain-%d" % p, "partition": p}
                                                for p in (0, 1)])
    return producer, coordinator


def _state(cluster) -> str:
    return cluster.query("SELECT state FROM transactions WHERE transactional_id = 'failover'"
                         )[0][0]


def test_markers_left_by_a_killed_partition_leader_are_written_by_the_next(cluster):
    producer, coordinator = _start(cluster)
    other = 3 - coordinator
    led_by_other = [p for p, (leader, _) in cluster.leaders("fo").items() if leader == other]
    assert led_by_other, cluster.leaders("fo")
    producer.begin_transaction()
    for i in range(20):
        producer.produce("fo", value=b"txn-%d" % i, partition=i % 2)
    producer.flush(TIMEOUT)
    # The other node cannot write its marker: stopped, then killed.
    os.kill(cluster.nodes[other].process.pid, signal.SIGSTOP)
    try:
        producer.commit_transaction(TIMEOUT)  # answered once PrepareCommit is durable
        assert _state(cluster) == "PrepareCommit"
        # the coordinator's own partition gets its marker; the stopped node's stays pending
        cluster.wait_for(lambda: sorted(p for (p,) in cluster.query(
            "SELECT partition FROM txn_markers")) == led_by_other, what="one marker pending")
        assert _state(cluster) == "PrepareCommit"
    finally:
        cluster.nodes[other].kill()
    cluster.wait_for(lambda: _state(cluster) == "CompleteCommit", timeout=40,
                     what="the next leader writing the pending marker")
    survivor = cluster.nodes[coordinator].address
    committed = consume_all(survivor, "fo", "read_committed", partitions=2, expected=22)
    assert values(committed) == sorted([b"plain-0", b"plain-1"]
                                       + [b"txn-%d" % i for i in range(20)])
    # one marker per partition, none twice: 2 plain + 20 + 2 markers
    assert cluster.query("SELECT sum(committed_end) FROM partitions p JOIN topics t "
                         "USING (topic_id) WHERE t.name = 'fo'")[0][0] == 24
    producer.begin_transaction()
    producer.produce("fo", value=b"after", partition=0)
    producer.commit_transaction(TIMEOUT)
    assert b"after" in values(consume_all(survivor, "fo", "read_committed", partitions=2,
                                          expected=23))


def test_a_transaction_whose_coordinator_is_killed_is_finished_by_the_next(cluster):
    producer, coordinator = _start(cluster)
    producer.begin_transaction()
    for i in range(20):
        producer.produce("fo", value=b"txn-%d" % i, partition=i % 2)
    producer.flush(TIMEOUT)
    cluster.nodes[coordinator].kill()
    producer.commit_transaction(TIMEOUT)  # retried until the next coordinator answers
    survivor = cluster.nodes[3 - coordinator].address
    cluster.wait_for(lambda: _state(cluster) == "CompleteCommit", timeout=40,
                     what="the transaction complete")
    committed = consume_all(survivor, "fo", "read_committed", partitions=2, expected=22)
    assert values(committed) == sorted([b"plain-0", b"plain-1"]
                                       + [b"txn-%d" % i for i in range(20)])
    # Aborted ones stay invisible after the move too.
    producer.begin_transaction()
    producer.produce("fo", value=b"dropped", partition=1)
    producer.flush(TIMEOUT)
    producer.abort_transaction(TIMEOUT)
    assert b"dropped" not in values(consume_all(survivor, "fo", "read_committed",
                                                partitions=2))

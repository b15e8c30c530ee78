"""Transactions under faults with stock clients: PostgreSQL unreachable for the node that
verifies a transactional batch (KIP-890), a Produce delayed past its transaction's abort."""

from __future__ import annotations

import trio

from mink.protocol.topics import TRANSACTION_STATE_TOPIC
from tests.test_transactions import TIMEOUT, consume_all, txn_producer, values


async def _two_nodes(mink_postgres, **settings):
    from mink.testing import open_cluster

    return open_cluster(2, mink_postgres, transaction_state_num_partitions=1,
                        group_initial_rebalance_delay_ms=0, **settings)


async def test_a_postgres_blip_during_verification_is_retried_and_the_transaction_commits(
        mink_postgres):
    """The data partition's leader (node 2) cannot reach PostgreSQL when the first batch of
    a transaction arrives: the coordinator (node 1) added the partition, but node 2 cannot
    verify it. The batch is refused retriably (NOT_ENOUGH_REPLICAS, as Kafka answers when
    its verification cannot reach the coordinator), librdkafka retries, and once PostgreSQL
    answers again the transaction commits. INVALID_TXN_STATE here would make the client
    abort a transaction nothing was wrong with."""
    # A long lease: the blip is shorter, node 2 stays a leader throughout.
    async with await _two_nodes(mink_postgres, lease_ttl=30.0) as cluster:
        await cluster.create_topic(TRANSACTION_STATE_TOPIC, 1)
        await cluster.create_topic("blip", 1)
        await cluster.move_leadership(TRANSACTION_STATE_TOPIC, 0, 1)
        await cluster.move_leadership("blip", 0, 2)
        verifier = cluster.node(2)
        producer = await trio.to_thread.run_sync(
            lambda: txn_producer(cluster.bootstrap, "blip-txn"))
        await trio.to_thread.run_sync(producer.begin_transaction)
        verifier.cut_postgres()
        try:
            await trio.to_thread.run_sync(
                lambda: producer.produce("blip", value=b"through-the-blip", partition=0))
            with trio.fail_after(TIMEOUT):  # the batch reached node 2, which could not verify
                while verifier.node.transactions.unverified_batches == 0:
                    await trio.to_thread.run_sync(producer.poll, 0.05)
        finally:
            verifier.restore_postgres()
        await trio.to_thread.run_sync(lambda: producer.commit_transaction(TIMEOUT))
        committed = await trio.to_thread.run_sync(
            lambda: consume_all(cluster.bootstrap, "blip", "read_committed", partitions=1,
                                expected=1))
        assert values(committed) == [b"through-the-blip"]

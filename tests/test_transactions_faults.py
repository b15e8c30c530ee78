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


async def test_a_produce_held_by_a_proxy_past_its_abort_is_refused_and_the_lso_moves(
        mink_postgres, nursery):
    """A confluent-kafka transactional producer's Produce is held in a TCP proxy in front of
    the partition's leader (node 2) while the coordinator (node 1) aborts the transaction:
    a new instance with the same transactional id starts (InitProducerId aborts the open
    transaction with a bumped epoch). When the proxy lets it through, the batch is refused (its transaction
    is over; without verification it would open a transaction nobody ends) and the LSO
    stays at the end of the partition."""
    import msgspec
    from confluent_kafka import KafkaError, KafkaException

    from mink.client import KafkaClient
    from mink.storage.embedded_postgres import free_port
    from mink.testing.proxy import TcpProxy
    from tests.test_transactions import _txn_requests

    _, _, _, list_latest = _txn_requests()
    async with await _two_nodes(
            mink_postgres, proxy=False,
            ) as cluster:
        # Node 2 is reached by clients through the proxy: it advertises the proxy's address.
        behind = cluster.node(2)
        await behind.stop()
        port = free_port()
        proxy = TcpProxy("127.0.0.1", port)
        await nursery.start(proxy.run)
        proxy_host, proxy_port = proxy.address
        behind.config = msgspec.structs.replace(
            behind.config, listener=f"127.0.0.1:{port}",
            advertised_listener=f"{proxy_host}:{proxy_port}")
        await behind.start()
        await cluster.create_topic(TRANSACTION_STATE_TOPIC, 1)
        await cluster.create_topic("held", 1)
        await cluster.move_leadership(TRANSACTION_STATE_TOPIC, 0, 1)
        await cluster.move_leadership("held", 0, 2)
        direct = await KafkaClient.connect(behind.bootstrap)  # node 2, not through the proxy

        async def offsets() -> tuple[int, int]:
            """(LSO, high watermark) of held-0."""
            out = []
            for isolation in (1, 0):
                response = await direct.call(2, 7, list_latest("held", isolation))
                out.append(response.topics[0].partitions[0].offset)
            return tuple(out)

        delivered = []
        try:
            producer = await trio.to_thread.run_sync(lambda: txn_producer(
                cluster.node(1).bootstrap, "held-txn"))

            def warm_up():  # the connection to node 2 is up before the proxy holds it
                producer.begin_transaction()
                producer.produce("held", value=b"warm-up", partition=0)
                producer.commit_transaction(TIMEOUT)

            await trio.to_thread.run_sync(warm_up)
            proxy.stall()
            await trio.to_thread.run_sync(producer.begin_transaction)
            await trio.to_thread.run_sync(lambda: producer.produce(
                "held", value=b"late", partition=0,
                on_delivery=lambda error, message: delivered.append(error)))
            with trio.fail_after(TIMEOUT):  # the Produce is in the proxy
                while proxy.bytes_held_to_upstream == 0:
                    await trio.to_thread.run_sync(producer.poll, 0.05)
            # The successor's InitProducerId aborts the held one's transaction first.
            successor = await trio.to_thread.run_sync(lambda: txn_producer(
                cluster.node(1).bootstrap, "held-txn"))
            store = cluster.node(1).node.transactions.store
            assert (await cluster.node(1).call(store.read, "held-txn")).state == "Empty"
            before = await offsets()
            assert before[0] == before[1], f"the LSO reached the end after the abort: {before}"
            proxy.resume()

            def poll():
                try:
                    producer.poll(0.05)
                except KafkaException as exc:  # the fatal error of a fenced producer
                    delivered.append(exc.args[0])

            with trio.fail_after(TIMEOUT):  # the held Produce reached node 2 and was answered
                while not delivered:
                    await trio.to_thread.run_sync(poll)
            assert delivered[0] is not None, "the late batch must be refused"
            # Refused as the zombie it is: the abort's marker carries the bumped epoch.
            assert delivered[0].code() in (KafkaError._FENCED, KafkaError.INVALID_TXN_STATE,
                                           KafkaError.INVALID_PRODUCER_EPOCH), delivered[0]
            assert await offsets() == before, "nothing appended, the LSO did not stop"
            del successor
            uncommitted = await trio.to_thread.run_sync(lambda: consume_all(
                behind.bootstrap, "held", "read_uncommitted", partitions=1))
            assert values(uncommitted) == [b"warm-up"]
        finally:
            proxy.resume()
            await direct.aclose()

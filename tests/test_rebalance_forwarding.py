"""A `mink cluster rebalance` under load on three subprocess nodes (issue 25): with produce
forwarding on, the clients are answered no NOT_LEADER_OR_FOLLOWER while partitions move (the
old leader forwards to the new one, and a new leader still opening a partition waits for its
open), and with it off producers are: counted on the wire, by a proxy in front of every node
that decodes the responses, in the same run. A consumer reads meanwhile (its NOT_LEADER
answers are counted and printed, not asserted). Nothing is lost or duplicated with
idempotence on.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from kio.schema.errors import ErrorCode

from mink.storage.embedded_postgres import free_port
from tests.support.wire import KafkaWireCounter
from tests.test_cluster import Load, consume_all, create_topic
from tests.test_controlled_shutdown import led_by, mink_cli

NOT_LEADER = int(ErrorCode.not_leader_or_follower)
PARTITIONS = 12
ACKED_AFTER_MOVES = 2000  # acknowledged writes after every moved partition is open again


@pytest.mark.parametrize("forwarding", [True, False], ids=["forwarding-on", "forwarding-off"])
def test_a_rebalance_under_load_answers_no_not_leader_with_forwarding(cluster, forwarding):
    with contextlib.ExitStack() as stack:
        counters = {}
        for node_id in (1, 2, 3):
            # Clients come in on CLIENT, through the counter; nodes reach each other on
            # INTERNAL, directly (the counter's thread stays out of forwarding's way).
            internal, client = free_port(), free_port()
            counter = stack.enter_context(KafkaWireCounter("127.0.0.1", client).in_thread())
            counters[node_id] = counter
            host, proxy_port = counter.address
            cluster.start(node_id, listener=f"127.0.0.1:{internal}",
                          listeners=f"INTERNAL://127.0.0.1:{internal},"
                                    f"CLIENT://127.0.0.1:{client}",
                          advertised_listeners=f"INTERNAL://127.0.0.1:{internal},"
                                               f"CLIENT://{host}:{proxy_port}",
                          listener_security_protocol_map="INTERNAL:PLAINTEXT,CLIENT:PLAINTEXT",
                          inter_broker_listener_name="INTERNAL",
                          produce_forwarding=forwarding)
            if node_id == 2:  # the topic on two nodes; the third joins to be given some
                cluster.wait_for(lambda: cluster.live_nodes() == {1, 2}, what="two nodes")
                cluster.wait_for(cluster.coordinator, what="a coordinator")
                create_topic(cluster.bootstrap, "moving", PARTITIONS)
        cluster.wait_for(lambda: cluster.live_nodes() == {1, 2, 3}, what="three live nodes")
        bootstrap = ",".join("%s:%d" % c.address for c in counters.values())

        reader = Reader(bootstrap, "moving")
        with Load(bootstrap, "moving") as load, reader:
            cluster.wait_for(lambda: len(load.acked) > 1000, what="writes acknowledged")
            out = mink_cli(cluster, "rebalance")
            assert out.returncode == 0, out.stderr
            cluster.wait_for(lambda: led_by(cluster, 3), what="partitions moved to node 3")
            cluster.wait_for(lambda: all(
                cluster.open_streams("moving").get(p, (None,))[0] == leader
                for p, (leader, _) in cluster.leaders("moving").items()),
                what="moved partitions open at their new leaders")
            acked_then = len(load.acked)
            cluster.wait_for(lambda: len(load.acked) > acked_then + ACKED_AFTER_MOVES,
                             what="writes acknowledged after the moves")
            moved_to_3 = {p for p, (leader, _) in cluster.leaders("moving").items()
                          if leader == 3}
        assert load.errors == [], load.errors[:5]
        assert reader.errors == [], reader.errors[:5]
        assert moved_to_3, "the rebalance moved nothing"
        # the writes after the moves reached node 3's partitions (clients followed)
        assert {p for p, _ in load.acked.values()} >= moved_to_3

        not_leader = sum(c.count("produce", NOT_LEADER) for c in counters.values())
        produce_answers = sum(c.responses["produce"] for c in counters.values())
        assert produce_answers > 100 and not any(c.undecoded for c in counters.values())
        if forwarding:
            assert not_leader == 0, f"{not_leader} NOT_LEADER_OR_FOLLOWER answers"
        else:
            assert not_leader > 0, "a move without forwarding answered no NOT_LEADER"

        fetch_not_leader = sum(c.count("fetch", NOT_LEADER) for c in counters.values())
        fetch_answers = sum(c.responses["fetch"] for c in counters.values())
        assert fetch_answers > 10 and len(reader.values) > 1000
        # Fetches: any node serves committed data, yet a few NOT_LEADER_OR_FOLLOWER were
        # seen in some runs, either setting (0-5 of ~600, not explained yet): reported only.

        read = consume_all(bootstrap, "moving", PARTITIONS, len(load.acked))
        values = [v for _, _, v in read]
        assert len(values) == len(set(values)), "a message was written twice"
        assert set(values) == set(load.acked), "an acknowledged message is missing"
        print(f"forwarding={forwarding}: {not_leader} NOT_LEADER_OR_FOLLOWER of "
              f"{produce_answers} produce answers, {fetch_not_leader} of {fetch_answers} "
              f"fetch answers, {len(load.acked)} acked, "
              f"{len(moved_to_3)} partitions moved at {time.strftime('%H:%M:%S')}")


class Reader:
    """A confluent-kafka consumer reading every partition from the start until stopped."""

    def __init__(self, bootstrap: str, topic: str):
        from confluent_kafka import Consumer, TopicPartition

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "mover-reader",
                                  "enable.auto.commit": False,
                                  "topic.metadata.refresh.interval.ms": 1000})
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.values: list[bytes] = []
        self.errors: list = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            message = self.consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                self.errors.append(message.error())
            else:
                self.values.append(message.value())
        self.consumer.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)

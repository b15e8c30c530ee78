"""A `mink cluster rebalance` under load on three subprocess nodes (issue 25), twice in one
run: with produce forwarding on, the clients are answered no NOT_LEADER_OR_FOLLOWER while
partitions move (the old leader forwards to the new one, and a new leader still opening a
partition waits for its open); then every node is restarted with `produce_forwarding =
false` and the same rebalance answers producers NOT_LEADER_OR_FOLLOWER. Counted on the wire,
by a proxy in front of every node that decodes the responses. A consumer tailing every
partition meanwhile is answered none either way (any node serves committed data, and a
Fetch whose logs close under it one after the other reads each from a view). Nothing is lost
or duplicated with idempotence on.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from mink.storage.embedded_postgres import free_port
from tests.support.wire import KafkaWireCounter
from tests.test_cluster import Load, consume_all, create_topic
from tests.test_controlled_shutdown import mink_cli

NOT_LEADER = int(ErrorCode.not_leader_or_follower)
PARTITIONS = 12
ACKED_AFTER_MOVES = 2000  # acknowledged writes after every moved partition is open again


@dataclass
class Phase:
    """What the clients of one rebalance saw, counted on the wire during it."""
    acked: dict
    moved_to_3: set
    produce_not_leader: int
    produce_answers: int
    fetch_not_leader: int
    fetch_answers: int
    read: int

    def __str__(self) -> str:
        return (f"{self.produce_not_leader} NOT_LEADER_OR_FOLLOWER of {self.produce_answers} "
                f"produce answers, {self.fetch_not_leader} of {self.fetch_answers} fetch "
                f"answers, {len(self.acked)} acked, {self.read} read, "
                f"{len(self.moved_to_3)} partitions moved to node 3")


def test_a_rebalance_answers_no_not_leader_with_forwarding_and_some_without(cluster):
    with contextlib.ExitStack() as stack:
        counters, ports = {}, {}

        def start(node_id: int, forwarding: bool) -> None:
            # Clients come in on CLIENT, through the counter; nodes reach each other on
            # INTERNAL, directly (the counter's thread stays out of forwarding's way).
            internal, client = ports[node_id]
            host, proxy_port = counters[node_id].address
            cluster.start(node_id, listener=f"127.0.0.1:{internal}",
                          listeners=f"INTERNAL://127.0.0.1:{internal},"
                                    f"CLIENT://127.0.0.1:{client}",
                          advertised_listeners=f"INTERNAL://127.0.0.1:{internal},"
                                               f"CLIENT://{host}:{proxy_port}",
                          listener_security_protocol_map="INTERNAL:PLAINTEXT,CLIENT:PLAINTEXT",
                          inter_broker_listener_name="INTERNAL",
                          produce_forwarding=forwarding)

        for node_id in (1, 2, 3):
            ports[node_id] = free_port(), free_port()
            counters[node_id] = stack.enter_context(
                KafkaWireCounter("127.0.0.1", ports[node_id][1]).in_thread())
            start(node_id, True)
            if node_id == 2:  # the topic on two nodes; the third joins to be given some
                cluster.wait_for(lambda: cluster.live_nodes() == {1, 2}, what="two nodes")
                cluster.wait_for(cluster.coordinator, what="a coordinator")
                create_topic(cluster.bootstrap, "moving", PARTITIONS)
        cluster.wait_for(lambda: cluster.live_nodes() == {1, 2, 3}, what="three live nodes")
        bootstrap = ",".join("%s:%d" % c.address for c in counters.values())

        on = rebalance_under_load(cluster, counters, bootstrap, b"on")

        # The same cluster with forwarding off: each node stopped with SIGTERM (its
        # partitions handed over) and started again with produce_forwarding = false. Node 3,
        # restarted last, comes back leading nothing (a node back from a clean stop is given
        # no partitions until a rebalance), so the next rebalance moves partitions to it
        # again. No client runs meanwhile: the restarts' answers are in neither phase.
        for node_id in (1, 2, 3):
            assert cluster.nodes[node_id].stop() == 0
            start(node_id, False)
            cluster.wait_for(lambda: node_id in cluster.live_nodes(), what="the node back")
        assert not any(leader == 3 for leader, _ in cluster.leaders("moving").values()), (
            "node 3 leads partitions after its controlled shutdown and restart: "
            f"{cluster.leaders('moving')}")
        wait_open(cluster)

        off = rebalance_under_load(cluster, counters, bootstrap, b"off")
        acked = {**on.acked, **off.acked}
        read = consume_all(bootstrap, "moving", PARTITIONS, len(acked))

    print(f"forwarding on: {on}\nforwarding off: {off}")
    assert on.produce_not_leader == 0, f"forwarding on: {on}"
    assert off.produce_not_leader > 0, f"a move without forwarding: {off}"
    # Fetches are served by any node whatever produce_forwarding says (3-9 a phase were
    # answered NOT_LEADER_OR_FOLLOWER while only a Fetch's first closed log was read again
    # from a view: a rebalance closes a node's logs one after the other).
    assert on.fetch_not_leader == off.fetch_not_leader == 0, f"on: {on}; off: {off}"

    values = [v for _, _, v in read]
    assert len(values) == len(set(values)), "a message was written twice"
    assert set(values) == set(acked), "an acknowledged message is missing"


def rebalance_under_load(cluster, counters: dict, bootstrap: str, prefix: bytes) -> Phase:
    """An idempotent producer and a consumer tailing every partition, a `mink cluster
    rebalance` that moves partitions to node 3, writes going on until the moved partitions
    are open at node 3 and ACKED_AFTER_MOVES more are acknowledged; the wire counters' counts
    of that time."""
    before = wire_totals(counters)
    reader = Reader(bootstrap, "moving")
    with Load(bootstrap, "moving", prefix) as load, reader:
        cluster.wait_for(lambda: len(load.acked) > 1000, what="writes acknowledged")
        out = mink_cli(cluster, "rebalance")
        assert out.returncode == 0, out.stderr
        cluster.wait_for(lambda: any(leader == 3 for leader, _ in
                                     cluster.leaders("moving").values()),
                         what="partitions moved to node 3")
        wait_open(cluster)
        acked_then = len(load.acked)
        cluster.wait_for(lambda: len(load.acked) > acked_then + ACKED_AFTER_MOVES,
                         what="writes acknowledged after the moves")
        moved_to_3 = {p for p, (leader, _) in cluster.leaders("moving").items()
                      if leader == 3}
    after = wire_totals(counters)
    assert load.errors == [], load.errors[:5]
    assert reader.errors == [], reader.errors[:5]
    assert moved_to_3, "the rebalance moved nothing"
    # the writes after the moves reached node 3's partitions (clients followed)
    assert {p for p, _ in load.acked.values()} >= moved_to_3
    assert not any(c.undecoded for c in counters.values())
    phase = Phase(load.acked, moved_to_3, *(b - a for a, b in zip(before, after)),
                  read=len(reader.values))
    assert phase.produce_answers > 100 and phase.fetch_answers > 10 and phase.read > 1000, (
        str(phase))
    return phase


def wait_open(cluster) -> None:
    cluster.wait_for(lambda: all(
        cluster.open_streams("moving").get(p, (None,))[0] == leader
        for p, (leader, _) in cluster.leaders("moving").items()),
        what="every partition open at its leader")


def wire_totals(counters: dict) -> tuple[int, int, int, int]:
    """(produce NOT_LEADER, produce answers, fetch NOT_LEADER, fetch answers) so far."""
    return (sum(c.count("produce", NOT_LEADER) for c in counters.values()),
            sum(c.responses["produce"] for c in counters.values()),
            sum(c.count("fetch", NOT_LEADER) for c in counters.values()),
            sum(c.responses["fetch"] for c in counters.values()))


class Reader:
    """A confluent-kafka consumer tailing every partition (from its end) until stopped."""

    def __init__(self, bootstrap: str, topic: str):
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "mover-reader",
                                  "enable.auto.commit": False,
                                  "topic.metadata.refresh.interval.ms": 1000})
        self.consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(PARTITIONS)])
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

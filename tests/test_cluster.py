"""Three (and four) nodes as subprocesses on one PostgreSQL and one S3 endpoint: spreading,
failover, fencing, the coordinator, rebalancing, PostgreSQL outages."""

from __future__ import annotations

import collections
import subprocess
import sys
import threading
import time

import pytest

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.cluster import LEASE_TTL, TICK
from tests.support.kafka_python import wait_for_partitions

def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=20)
    futures[name].result(30)


class Load:
    """An idempotent producer sending numbered messages until stopped; remembers the acked."""

    def __init__(self, bootstrap: str, topic: str, prefix: bytes = b"m"):
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                  "linger.ms": 5, "message.timeout.ms": 60000,
                                  "topic.metadata.refresh.interval.ms": 1000})
        self.topic = topic
        self.prefix = prefix  # the values are prefix + a number: two loads' never collide
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.errors: list = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, err, msg):
        if err:
            self.errors.append(err)
        else:
            self.acked[msg.value()] = (msg.partition(), msg.offset())

    def _run(self):
        i = 0
        while not self.stop.is_set():
            try:
                self.producer.produce(self.topic, key=b"%d" % i,
                                      value=self.prefix + b"%08d" % i,
                                      on_delivery=self._on_delivery)
                i += 1
            except BufferError:
                pass
            self.producer.poll(0.002)
        self.producer.flush(90)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(120)


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int,
                timeout: float = 60) -> list:
    """Every partition read from its start until `expected` messages came, or none came for
    `timeout` seconds: a slow read of a long history (one GET per WAL flush from moto, on a
    loaded machine) is not a loss, a stalled one is."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "checker",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < expected and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            out.append((msg.partition(), msg.offset(), msg.value()))
            deadline = time.monotonic() + timeout
    consumer.close()
    return out


def start_three(cluster):
    for node_id in (1, 2, 3):
        cluster.start(node_id)
    cluster.wait_for(lambda: cluster.live_nodes() == {1, 2, 3}, what="three live nodes")
    cluster.wait_for(cluster.coordinator, what="a coordinator")


def test_topics_spread_and_clients_follow_leaders(cluster):
    start_three(cluster)
    create_topic(cluster.bootstrap, "spread", 6)
    leaders = cluster.leaders("spread")
    assert collections.Counter(l for l, _ in leaders.values()) == {1: 2, 2: 2, 3: 2}
    producer = Producer({"bootstrap.servers": cluster.nodes[1].address})
    for i in range(3000):
        producer.produce("spread", key=b"%d" % i, value=b"v%d" % i)
        producer.poll(0)
    assert producer.flush(30) == 0
    got = consume_all(cluster.nodes[2].address, "spread", 6, 3000)
    assert sorted(v for _, _, v in got) == sorted(b"v%d" % i for i in range(3000))
    assert {p for p, _, _ in got} == set(range(6))


def test_sigkill_failover_loses_nothing_acknowledged(cluster):
    start_three(cluster)
    create_topic(cluster.bootstrap, "failover", 6)
    victims = {p for p, (leader, _) in cluster.leaders("failover").items() if leader == 2}
    with Load(cluster.bootstrap, "failover") as load:
        cluster.wait_for(lambda: len(load.acked) > 2000, what="acknowledged messages")
        killed_at = time.monotonic()
        cluster.nodes[2].kill()

        def moved():
            leaders = cluster.leaders("failover")
            streams = cluster.open_streams("failover")
            return all(leaders[p][0] in (1, 3) and streams.get(p, (None,))[0] == leaders[p][0]
                       for p in victims)

        cluster.wait_for(moved, timeout=LEASE_TTL + TICK + 20, what="partitions re-led")
        failover_s = time.monotonic() - killed_at
        acked_at_failover = len(load.acked)
        cluster.wait_for(lambda: len(load.acked) > acked_at_failover + 2000,
                         what="produce going on after the failover")
    print(f"partitions of the killed node led again after {failover_s:.2f}s "
          f"(lease_ttl {LEASE_TTL}s + tick {TICK}s)")
    assert failover_s < LEASE_TTL + TICK + 10
    assert not load.errors, load.errors[:3]
    got = consume_all(cluster.bootstrap, "failover", 6, len(load.acked))
    values = collections.Counter(v for _, _, v in got)
    assert all(c == 1 for c in values.values()), "the idempotent producer left duplicates"
    missing = sorted((load.acked[v], v) for v in set(load.acked) - set(values))
    ends = cluster.query("SELECT p.partition, p.committed_end, p.leader_node, p.leader_epoch "
                         "FROM partitions p JOIN topics t USING (topic_id) "
                         "WHERE t.name = 'failover' ORDER BY 1")
    assert not missing, f"acknowledged messages lost: {missing[:10]} ({len(missing)}); " \
        f"consumed {len(got)} of {len(load.acked)}; partitions {ends}"
    for value, (partition, offset) in load.acked.items():
        assert (partition, offset, value) in set(got)


def test_restarted_node_has_a_new_epoch_and_its_old_epoch_is_fenced(cluster):
    start_three(cluster)
    create_topic(cluster.bootstrap, "fence", 6)
    old_epoch = cluster.node_epoch(2)
    led_before = {p for p, (leader, _) in cluster.leaders("fence").items() if leader == 2}
    cluster.nodes[2].kill()
    cluster.wait_for(lambda: all(cluster.leaders("fence")[p][0] != 2 for p in led_before),
                     timeout=LEASE_TTL + 20, what="partitions moved off node 2")
    cluster.start(2)
    cluster.wait_for(lambda: 2 in cluster.live_nodes(), what="node 2 back")
    assert cluster.node_epoch(2) > old_epoch
    # A node answers no request before it registered and ran its first sync of the view:
    # once node 2 answers Metadata, that sync is done, and it must not have opened what it
    # no longer leads.
    AdminClient({"bootstrap.servers": cluster.nodes[2].address}).list_topics(timeout=30)
    # a later sync: node 2 opens its share of a topic created now
    create_topic(cluster.bootstrap, "fence-later", 3)
    cluster.wait_for(lambda: 2 in {opener for opener, _ in
                                   cluster.open_streams("fence-later").values()},
                     what="node 2 opening a partition of a later topic (a later sync)")
    streams = cluster.open_streams("fence")
    leaders = cluster.leaders("fence")
    assert all(streams[p][0] == leaders[p][0] != 2 for p in led_before)
    # A WAL commit tagged with the old epoch is refused whole.
    result = subprocess.run([sys.executable, "-c", f"""
import trio, trio_asyncio, uuid
from mink.storage.controlplane import MetadataStore, WalObject, WalRange
async def main():
    async with trio_asyncio.open_loop():
        store = await MetadataStore.open({cluster.pg_url!r}, migrate=False)
        topic = await store.get_topic("fence")
        out = await store.commit_wal(2, {old_epoch}, [WalObject(key="wal/2/{old_epoch}/x",
            size=1, ranges=[WalRange(topic_id=topic.topic_id, partition=0, leader_epoch=0,
            base_offset=0, last_offset=0, byte_start=0, byte_end=1, max_timestamp=0,
            batch_count=1)])])
        print(out[0].committed, out[0].ranges[0].reason)
        await store.aclose()
trio.run(main)
"""], capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["False", "stale_node_epoch"], result.stderr


def test_coordinator_failover_and_stale_coordinator_refused(cluster):
    start_three(cluster)
    create_topic(cluster.bootstrap, "coord", 6)
    first = cluster.coordinator()
    old_lease_epoch = cluster.query("SELECT epoch FROM leases WHERE scope = 'coordinator'")[0][0]
    orphaned = {p for p, (leader, _) in cluster.leaders("coord").items() if leader == first}
    cluster.nodes[first].kill()
    second = cluster.wait_for(lambda: (c := cluster.coordinator()) not in (None, first) and c,
                              timeout=LEASE_TTL + 20, what="a new coordinator")
    cluster.wait_for(lambda: all(cluster.leaders("coord")[p][0] not in (None, first)
                                 for p in orphaned), timeout=20, what="orphans re-led")
    # A LeadBucket carrying the old coordinator epoch is refused.
    result = subprocess.run([sys.executable, "-c", f"""
import trio, trio_asyncio
from mink.storage.controlplane import MetadataStore, StaleEpoch
async def main():
    async with trio_asyncio.open_loop():
        store = await MetadataStore.open({cluster.pg_url!r}, migrate=False)
        topic = await store.get_topic("coord")
        try:
            await store.lead_partition(topic.topic_id, 0, {second}, {old_lease_epoch})
            print("accepted")
        except StaleEpoch as exc:
            print("refused", exc.reason)
        await store.aclose()
trio.run(main)
"""], capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["refused", "stale_coordinator_epoch"], result.stderr


def test_rebalance_after_a_fourth_node_joins(cluster):
    start_three(cluster)
    create_topic(cluster.bootstrap, "balance", 12)
    cluster.start(4)
    cluster.wait_for(lambda: 4 in cluster.live_nodes(), what="node 4")
    assert all(l != 4 for l, _ in cluster.leaders("balance").values()), "nothing moves by itself"
    out = subprocess.run([sys.executable, "-m", "mink.cli", "cluster", "rebalance",
                          "--postgres-url", cluster.pg_url, "--json"],
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    # The load is every partition a node leads, of every topic (internal ones included).
    loads = collections.Counter(r[0] for r in cluster.query(
        "SELECT leader_node FROM partitions p JOIN topics t USING (topic_id) "
        "WHERE t.deleted_at IS NULL"))
    mean = sum(loads.values()) / 4
    assert all(0.9 * mean <= loads[n] <= 1.1 * mean for n in (1, 2, 3, 4)), loads
    cluster.wait_for(lambda: all(cluster.open_streams("balance").get(p, (None,))[0] == l
                                 for p, (l, _) in cluster.leaders("balance").items()),
                     what="moved partitions opened by their new leaders")
    status = subprocess.run([sys.executable, "-m", "mink.cli", "cluster", "status",
                             "--postgres-url", cluster.pg_url],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "coordinator: node" in status.stdout


def test_postgres_outages_short_and_long(cluster, pg_server):
    start_three(cluster)
    create_topic(cluster.bootstrap, "outage", 3)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True,
                         "message.timeout.ms": 120000})
    acked = []
    for i in range(300):
        producer.produce("outage", value=b"before-%d" % i,
                         on_delivery=lambda err, msg: err or acked.append(msg.value()))
    assert producer.flush(30) == 0
    epochs = {n: cluster.node_epoch(n) for n in (1, 2, 3)}
    leaders = cluster.leaders("outage")
    # Short: less than lease_ttl. Cached reads go on; nothing moves.
    pg_server.stop("fast")
    try:
        got = consume_all(cluster.bootstrap, "outage", 3, 300, timeout=LEASE_TTL / 2)
        assert len(got) == 300, "cached reads must be served while PostgreSQL is down"
    finally:
        pg_server.start()
    assert {n: cluster.node_epoch(n) for n in (1, 2, 3)} == epochs
    assert cluster.leaders("outage") == leaders
    # Long: more than lease_ttl. Nodes stop leading, then register again and reopen.
    pg_server.stop("fast")
    time.sleep(LEASE_TTL + 1)
    pg_server.start()
    cluster.wait_for(lambda: all(cluster.node_epoch(n) > epochs[n] for n in (1, 2, 3)),
                     timeout=30, what="every node registered again")
    for i in range(300):
        producer.produce("outage", value=b"after-%d" % i,
                         on_delivery=lambda err, msg: err or acked.append(msg.value()))
    assert producer.flush(60) == 0
    got = consume_all(cluster.bootstrap, "outage", 3, len(acked))
    assert sorted(v for _, _, v in got) == sorted(acked), "nothing acknowledged is lost"
    assert all(p.poll() is None for p in (n.process for n in cluster.nodes.values())), \
        "no node restarted"


def test_background_leases_are_shared(cluster):
    from mink.broker.cluster.leases import preference

    start_three(cluster)
    create_topic(cluster.bootstrap, "leased", 6)
    topic_id = cluster.query("SELECT topic_id FROM topics WHERE name = 'leased'")[0][0]
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(120):
        producer.produce("leased", value=b"x" * 100, partition=i % 6)
    assert producer.flush(30) == 0

    def taken():
        rows = cluster.query("SELECT scope, holder, epoch FROM leases WHERE expires_at > now() "
                             "AND scope LIKE %s", f"%{topic_id}%")
        # seed 001's partition leases host no work: none is taken (issue 22)
        assert not [s for s, _, _ in rows if s.startswith("partition/")], rows
        writers = [(h, e) for s, h, e in rows if s.startswith("writer/")]
        return writers[0] if len(writers) == 1 else None

    writer, epoch = cluster.wait_for(taken, timeout=30, what="the topic's writer lease taken")
    scope = f"writer/{topic_id}"
    assert writer == max((1, 2, 3), key=lambda n: preference(n, scope))
    stats = cluster.wait_for(lambda: cluster.query(
        "SELECT records, computed_by, lease_epoch FROM topic_stats WHERE topic_id = %s "
        "AND records = 120", topic_id), timeout=30, what="topic statistics")
    assert stats[0][1:] == (writer, epoch)


def _read_through(client: str, bootstrap: str, topic: str, partitions: int, stop, out: list):
    """Read from the beginning until `stop` is set and nothing more arrives."""
    if client == "confluent":
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                             "enable.auto.commit": False,
                             "max.partition.fetch.bytes": 20000,
                             "topic.metadata.refresh.interval.ms": 1000})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        idle = 0
        while not (stop.is_set() and idle > 10):
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                idle += 1
                continue
            idle = 0
            out.append((msg.partition(), msg.offset(), msg.value()))
        consumer.close()
    else:
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KTopicPartition

        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                 enable_auto_commit=False, max_partition_fetch_bytes=20000,
                                 metadata_max_age_ms=1000, request_timeout_ms=10000)
        consumer.assign([KTopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        idle = 0
        while not (stop.is_set() and idle > 10):
            batch = consumer.poll(timeout_ms=200)
            if not batch:
                idle += 1
            for records in batch.values():
                idle = 0
                out += [(r.partition, r.offset, r.value) for r in records]
        consumer.close()


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_consumers_read_through_a_failover_without_skipping_or_rereading(cluster, client):
    start_three(cluster)
    create_topic(cluster.bootstrap, "through", 3)
    stop = threading.Event()
    out: list = []
    reader = threading.Thread(target=_read_through, daemon=True,
                              args=(client, cluster.bootstrap, "through", 3, stop, out))
    with Load(cluster.bootstrap, "through") as load:
        cluster.wait_for(lambda: len(load.acked) > 1500, what="messages before the failover")
        reader.start()
        cluster.wait_for(lambda: len(out) > 300, what="the reader under way")
        victim = cluster.leaders("through")[0][0]
        cluster.nodes[victim].kill()
        cluster.wait_for(lambda: cluster.leaders("through")[0][0] != victim,
                         timeout=LEASE_TTL + 20, what="partition 0 re-led")
        acked = len(load.acked)
        cluster.wait_for(lambda: len(load.acked) > acked + 1500, what="produce resumed")
    try:
        cluster.wait_for(lambda: len(out) >= len(load.acked), timeout=60,
                         what="the reader catching up")
    except AssertionError:
        progress = {}
        for p in range(3):
            offsets = sorted({o for q, o, _ in out if q == p})
            holes = sorted(set(range(offsets[-1] + 1)) - set(offsets)) if offsets else []
            progress[p] = (len(offsets), offsets[-1] if offsets else None, holes[:3], len(holes))
        ends = cluster.query("SELECT p.partition, p.committed_end, p.leader_node, "
                             "p.leader_epoch FROM partitions p JOIN topics t USING (topic_id) "
                             "WHERE t.name = 'through' ORDER BY 1")
        raise AssertionError(f"reader stuck: (count, last, holes) {progress}, partitions "
                             f"{ends}, killed node {victim}, acked {len(load.acked)}, "
                             f"read {len(out)}") from None
    finally:
        stop.set()
        reader.join(60)
    seen = collections.Counter((p, o) for p, o, _ in out)
    assert all(c == 1 for c in seen.values()), "a message was read twice"
    for partition in range(3):
        offsets = sorted(o for p, o in seen if p == partition)
        assert offsets == list(range(len(offsets))), f"partition {partition} skipped offsets"
    assert {v for _, _, v in out} >= set(load.acked)


def test_coordinator_actions_are_forwarded_from_any_node(cluster):
    start_three(cluster)
    coordinator = cluster.coordinator()
    other = next(n for n in (1, 2, 3) if n != coordinator)
    address = cluster.nodes[other].address
    # CreateTopics sent straight to a node that is not the coordinator.
    result = subprocess.run([sys.executable, "-m", "mink.cli", "topics", "create",
                             "forwarded", "--partitions", "4", "--bootstrap-server", address],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert len(cluster.leaders("forwarded")) == 4
    # Auto-creation by a Produce that reaches a node that is not the coordinator.
    producer = Producer({"bootstrap.servers": address})
    producer.produce("auto-forwarded", value=b"x")
    assert producer.flush(30) == 0
    assert len(cluster.leaders("auto-forwarded")) == 1


def test_group_consumers_carry_on_through_a_failover(cluster):
    start_three(cluster)
    create_topic(cluster.bootstrap, "grouped", 6)
    consumed: list[bytes] = []
    stop = threading.Event()

    def consume():
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "carry-on",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                             "topic.metadata.refresh.interval.ms": 1000})
        consumer.subscribe(["grouped"])
        while not stop.is_set():
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            consumed.append(msg.value())
            try:
                consumer.commit(msg, asynchronous=True)
            except Exception:
                pass  # a commit refused during a coordinator move: the next one lands
        consumer.close()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    with Load(cluster.bootstrap, "grouped") as load:
        cluster.wait_for(lambda: len(consumed) > 1000, what="the group consuming")
        # Kill the node that coordinates the group: the group moves with its partition.
        from mink.broker.groups.coordinator import partition_for

        victim = cluster.leaders("__consumer_offsets")[partition_for("carry-on", 50)][0]
        cluster.nodes[victim].kill()
        cluster.wait_for(lambda: all(l != victim for l, _ in cluster.leaders("grouped").values()),
                         timeout=LEASE_TTL + 20, what="partitions re-led")
        cluster.wait_for(lambda: cluster.leaders("__consumer_offsets")[
            partition_for("carry-on", 50)][0] != victim, timeout=20, what="group coordinator moved")
        acked = len(load.acked)
        cluster.wait_for(lambda: len(load.acked) > acked + 1000, what="produce resumed")
    cluster.wait_for(lambda: set(load.acked) <= set(consumed), timeout=60,
                     what="the group consuming every acknowledged message")
    stop.set()
    reader.join(30)


def test_kafka_python_producer_and_group_consumer_follow_the_leaders(cluster):
    from kafka import KafkaConsumer, KafkaProducer

    start_three(cluster)
    create_topic(cluster.bootstrap, "kp-cluster", 6)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all")  # idempotent
    for i in range(600):
        producer.send("kp-cluster", key=b"%d" % i, value=b"v%d" % i)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer("kp-cluster", bootstrap_servers=cluster.bootstrap,
                             group_id="kp-group", auto_offset_reset="earliest",
                             consumer_timeout_ms=15000)
    wait_for_partitions(consumer, "kp-cluster")
    seen = set()
    for message in consumer:
        seen.add(message.value)
        if len(seen) == 600:
            break
    consumer.commit()
    consumer.close()
    assert seen == {b"v%d" % i for i in range(600)}
    leaders = {leader for leader, _ in cluster.leaders("kp-cluster").values()}
    assert leaders == {1, 2, 3}, "the data was spread over all three leaders"

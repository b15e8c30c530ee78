"""Three subprocess nodes behind one address (issue 25): every node advertises one TCP proxy
for its clients, as behind a load balancer; the nodes reach each other directly on their
inter-broker listener. The balancer sends the connections to one node at a time (a round
robin over connections lines librdkafka's connection to "broker N" up with node N often
enough that nothing would be forwarded; pinned, what must be forwarded is known): node 1
while an idempotent confluent-kafka producer writes to every partition, node 2 while a
confluent-kafka consumer group, coordinated by another node, reads every partition. Nothing
lost, nothing duplicated, every partition in order, no partition answered an error on the
wire (the proxy decodes the Produce and Fetch responses), and each node's /metrics shows the
hops: node 1 forwarded produce to nodes 2 and 3, node 2 served the partitions it does not
lead from its replica views and forwarded the group's requests to their coordinator.
"""

from __future__ import annotations

import collections
import re
import time
import urllib.request

from mink.broker.groups.coordinator import partition_for
from mink.storage.embedded_postgres import free_port
from tests.support.wire import KafkaWireCounter
from tests.test_cluster import create_topic
from tests.test_produce_forwarding import _produce_idempotent

PARTITIONS = 6
COUNT = 3000


def test_clients_through_one_address_produce_to_and_consume_every_partition(cluster):
    ports = {n: (free_port(), free_port(), free_port()) for n in (1, 2, 3)}  # inter-broker,
    with KafkaWireCounter("127.0.0.1", ports[1][1]).in_thread() as lb:   # client, admin
        host, port = lb.address
        bootstrap = f"{host}:{port}"
        for node_id, (internal, client, admin) in ports.items():
            cluster.start(node_id, listener=f"127.0.0.1:{internal}",
                          listeners=f"INTERNAL://127.0.0.1:{internal},"
                                    f"CLIENT://127.0.0.1:{client}",
                          advertised_listeners=f"INTERNAL://127.0.0.1:{internal},"
                                               f"CLIENT://{bootstrap}",
                          listener_security_protocol_map="INTERNAL:PLAINTEXT,CLIENT:PLAINTEXT",
                          inter_broker_listener_name="INTERNAL",
                          admin_listener=f"127.0.0.1:{admin}")
        cluster.wait_for(lambda: cluster.live_nodes() == {1, 2, 3}, what="three live nodes")
        cluster.wait_for(cluster.coordinator, what="a coordinator")
        create_topic(bootstrap, "lb", PARTITIONS)
        leaders = cluster.wait_for(lambda: (
            (led := cluster.leaders("lb")) and all(leader for leader, _ in led.values())
            and led), what="the topic's leaders")
        assert {leader for leader, _ in leaders.values()} == {1, 2, 3}
        offsets = cluster.wait_for(lambda: cluster.leaders("__consumer_offsets"),
                                   what="__consumer_offsets")
        group = next(f"lb-{i}" for i in range(10_000)
                     if offsets[partition_for(f"lb-{i}", len(offsets))][0] not in (None, 2))

        report = _produce_idempotent(bootstrap, "lb", COUNT)  # through node 1
        assert report["errors"] == [] and report["delivered"] == COUNT, report
        lb.route_to("127.0.0.1", ports[2][1])
        got = consume_group(bootstrap, group, "lb", COUNT)  # through node 2

        assert not lb.undecoded
        errors = {key: n for key, n in lb.errors.items() if key[1] != 0}
        assert errors == {}, f"partitions answered with errors on the wire: {errors}"
        assert lb.responses["produce"] > 0 and lb.responses["fetch"] > 0
        hops = {n: metrics(ports[n][2]) for n in (1, 2, 3)}

    values = [value for _, _, value in got]
    assert len(values) == len(set(values)), "a message was read twice"
    assert sorted(values) == sorted(b"%d" % i for i in range(COUNT)), "messages lost"
    by_partition = collections.defaultdict(list)
    for partition, offset, value in got:
        by_partition[partition].append((offset, int(value)))
    assert sorted(by_partition) == list(range(PARTITIONS))
    for read in by_partition.values():  # offsets and values both increasing
        assert read == sorted(read) and [v for _, v in read] == sorted(v for _, v in read)

    print(f"hops seen in /metrics: {hops}")
    forwarded = hops[1]["produce_forwarded"]  # to the leaders of the other partitions
    assert set(forwarded) == {"2", "3"} and all(forwarded.values()), forwarded
    assert hops[2]["fetch_from_views"] > 0 and hops[2]["group_forwarded"] > 0, hops[2]
    assert not hops[3]["produce_forwarded"] and not hops[3]["fetch_from_views"], hops[3]


def consume_group(bootstrap: str, group: str, topic: str, count: int,
                  timeout: float = 60) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of `count` messages read by a confluent-kafka group member
    (committing as it goes); gives up after `timeout` s without a message. A consumer error
    fails the test."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "auto.commit.interval.ms": 500})
    consumer.subscribe([topic])
    got, errors = [], []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.3)
            if message is None:
                continue
            if message.error():
                errors.append(message.error())
                continue
            got.append((message.partition(), message.offset(), message.value()))
            deadline = time.monotonic() + timeout
    finally:
        consumer.close()
    assert not errors, errors[:5]
    return got


def metrics(admin_port: int) -> dict:
    """A node's forwarding counters from its /metrics: produce partitions forwarded (by
    target node), consumer Fetch partitions served from replica views, group and transaction
    requests forwarded to their coordinator."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()

    def samples(name: str) -> list[tuple[str, float]]:
        return [(labels, float(value)) for labels, value in re.findall(
            rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)]

    return {"produce_forwarded": {
                re.search(r'target="(\d+)"', labels).group(1): value
                for labels, value in samples("mink_produce_forwarded_partitions_total")},
            "fetch_from_views": sum(v for _, v in samples("mink_replica_fetch_partitions_total")),
            "group_forwarded": sum(
                v for _, v in samples("mink_coordinator_forwarded_requests_total"))}

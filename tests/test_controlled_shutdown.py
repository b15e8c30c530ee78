"""Controlled shutdown and `mink cluster drain` on three subprocess nodes (issue 25): a node
stopped with SIGTERM and kept down hands its partitions, its groups and the coordinator lease
over before it leaves; a drained node is given nothing until it is undrained.

The nodes run with the production `coordinator_tick` (5 s), not the suite's short one: the
hand-over must not wait for a tick, nor for `lease_ttl`.
"""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
import threading
import time

import psycopg
from confluent_kafka import Consumer

from mink.broker.groups.coordinator import partition_for
from tests.support.kafka_python import wait_for_partitions
from tests.test_cluster import Load, consume_all, create_topic

# The defaults' proportions (lease_ttl 30 s, coordinator_tick 5 s) at half the size: nothing
# here may wait for a tick, nor for a lease to expire.
TICK = 5.0
LEASE_TTL = 15.0
# Issue 25's target is 1 s, measured by benchmarks/controlled_shutdown.py (median 0.169 s);
# the test's bound is looser, for a machine running the suite two tests at a time (it saw
# 1.1-2.4 s there), and still far below what a lease expiry takes (lease_ttl 15 s).
WRITABLE_WITHIN = 5.0

SQL_NOT_WRITABLE_ELSEWHERE = """
SELECT count(*) FROM partitions p JOIN topics t USING (topic_id)
 WHERE t.deleted_at IS NULL
   AND (p.topic_id, p.partition) IN (SELECT * FROM unnest(%s::uuid[], %s::int[]))
   AND NOT (p.leader_node <> %s AND p.stream_state = 'open'
            AND p.opened_by_node = p.leader_node AND p.open_leader_epoch = p.leader_epoch)"""


def start_three(cluster):
    for node_id in (1, 2, 3):
        cluster.start(node_id, coordinator_tick=TICK, lease_ttl=LEASE_TTL)
    cluster.wait_for(lambda: cluster.live_nodes() == {1, 2, 3}, what="three live nodes")
    cluster.wait_for(cluster.coordinator, what="a coordinator")
    # The internal topics were created with the first node alone: spread them.
    out = mink_cli(cluster, "rebalance")
    assert out.returncode == 0, out.stderr


def led_by(cluster, node_id: int) -> list[tuple]:
    return cluster.query("SELECT topic_id, partition FROM partitions p JOIN topics t "
                         "USING (topic_id) WHERE t.deleted_at IS NULL AND leader_node = %s",
                         node_id)


def group_state(cluster, group: str) -> tuple[int, int]:
    rows = cluster.query("SELECT generation, json_array_length(members::json) FROM consumer_groups "
                         "WHERE group_id = %s", group)
    return rows[0] if rows else (0, 0)


def mink_cli(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mink.cli", "cluster", *args,
                           "--postgres-url", cluster.pg_url], capture_output=True, text=True,
                          timeout=120)


class GroupReader:
    """A confluent-kafka group member consuming (auto-committing) until stopped; counts its
    assignments (each one a rebalance)."""

    def __init__(self, bootstrap: str, topic: str, group: str):
        self.consumed: list[bytes] = []
        self.assignments = 0
        self.errors: list = []
        self.stop = threading.Event()
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group,
            # Committed every 500 ms, as applications usually do: a commit of every message
            # queues heartbeats behind thousands of commits on one connection.
            "auto.offset.reset": "earliest", "auto.commit.interval.ms": 500,
            "session.timeout.ms": 10000, "heartbeat.interval.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000})
        self.consumer.subscribe([topic], on_assign=self._on_assign)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _on_assign(self, consumer, partitions):
        self.assignments += 1

    def _run(self):
        while not self.stop.is_set():
            msg = self.consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                self.errors.append(msg.error())
                continue
            self.consumed.append(msg.value())
        self.consumer.close()

    def close(self):
        self.stop.set()
        self.thread.join(30)


def group_coordinated_by(cluster, node_id: int) -> str:
    """A group id whose __consumer_offsets partition `node_id` leads."""
    offsets = cluster.wait_for(lambda: cluster.leaders("__consumer_offsets"),
                               what="__consumer_offsets")
    return next(f"cs-{i}" for i in range(10_000)
                if offsets[partition_for(f"cs-{i}", len(offsets))][0] == node_id)


def test_sigterm_hands_everything_over_before_the_node_leaves(cluster):
    """The hardest case: the node stopped holds the coordinator lease and coordinates the
    consumer group. Under an idempotent producer and a consuming group: no delivery error,
    no consumer error, nothing lost or duplicated, the group's generation unchanged, every
    partition of the node writable elsewhere within WRITABLE_WITHIN (5 s: the suite runs two
    tests at a time; issue 25's 1 s target is measured by benchmarks/controlled_shutdown.py)
    of the SIGTERM, far below a lease expiry, the coordinator lease handed on."""
    start_three(cluster)
    create_topic(cluster.bootstrap, "drained", 6)
    victim = cluster.coordinator()
    group = group_coordinated_by(cluster, victim)
    others = ",".join(cluster.nodes[n].address for n in (1, 2, 3) if n != victim)
    reader = GroupReader(cluster.bootstrap, "drained", group)
    with Load(cluster.bootstrap, "drained") as load:
        cluster.wait_for(lambda: len(reader.consumed) > 1000 and len(load.acked) > 2000,
                         timeout=60, what="producing and the group consuming")
        generation = cluster.wait_for(lambda: group_state(cluster, group)[0],
                                      what="the group's generation stored")
        assignments = reader.assignments
        moving = led_by(cluster, victim)
        assert len(moving) >= 2, "the victim leads partitions (the group's among them)"
        with psycopg.connect(cluster.pg_url, autocommit=True) as conn:
            keys = ([m[0] for m in moving], [m[1] for m in moving], victim)
            sent = time.monotonic()
            cluster.nodes[victim].process.send_signal(signal.SIGTERM)
            writable_s = None
            while time.monotonic() - sent < LEASE_TTL + TICK + 10:
                if conn.execute(SQL_NOT_WRITABLE_ELSEWHERE, keys).fetchone()[0] == 0:
                    writable_s = time.monotonic() - sent
                    break
                time.sleep(0.005)
        exit_code = cluster.nodes[victim].process.wait(30)
        left_s = time.monotonic() - sent
        acked = len(load.acked)
        cluster.wait_for(lambda: len(load.acked) > acked + 2000, timeout=60,
                         what="produce going on without the stopped node")
    print(f"SIGTERM of node {victim} ({len(moving)} partitions): writable elsewhere after "
          f"{writable_s}s, process exited after {left_s:.2f}s")
    assert writable_s is not None, "partitions not moved"
    assert writable_s < WRITABLE_WITHIN, f"writable elsewhere only after {writable_s:.3f}s"
    assert exit_code == 0
    log_text = cluster.nodes[victim].log_path.read_text()
    assert "everything handed over" in log_text, log_text[-3000:]
    # it left: not live, nothing held; another node took the coordinator lease
    assert victim not in cluster.live_nodes()
    assert not cluster.query("SELECT scope FROM leases WHERE holder = %s "
                             "AND expires_at > now()", victim)
    assert cluster.wait_for(lambda: (c := cluster.coordinator()) not in (None, victim) and c,
                            timeout=TICK + 5, what="a new coordinator")
    assert not load.errors, load.errors[:5]
    cluster.wait_for(lambda: set(load.acked) <= set(reader.consumed), timeout=60,
                     what="the group consuming every acknowledged message")
    assert reader.assignments == assignments, "the group rebalanced"
    assert group_state(cluster, group)[0] == generation, "the group's generation moved"
    reader.close()
    assert not reader.errors, reader.errors[:5]
    got = consume_all(others, "drained", 6, len(load.acked))
    values = collections.Counter(v for _, _, v in got)
    assert not [v for v, c in values.items() if c > 1], "duplicates"
    assert set(load.acked) <= set(values), "acknowledged messages lost"
    for value, (partition, offset) in load.acked.items():
        assert (partition, offset, value) in set(got)


def test_kafka_python_clients_see_no_error_through_a_sigterm(cluster):
    """kafka-python's idempotent producer and group consumer, the node that leads partitions
    (not the coordinator) stopped with SIGTERM and kept down."""
    from kafka import KafkaConsumer, KafkaProducer

    start_three(cluster)
    create_topic(cluster.bootstrap, "kp-drained", 6)
    victim = next(n for n in (1, 2, 3) if n != cluster.coordinator())
    group = group_coordinated_by(cluster, victim)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all",
                             enable_idempotence=True, retries=1000, linger_ms=5,
                             metadata_max_age_ms=1000)
    consumer = KafkaConsumer("kp-drained", bootstrap_servers=cluster.bootstrap,
                             group_id=group, auto_offset_reset="earliest",
                             enable_auto_commit=True, auto_commit_interval_ms=200,
                             metadata_max_age_ms=1000, consumer_timeout_ms=500)
    wait_for_partitions(consumer, "kp-drained")
    sent, errors, consumed = [], [], []
    stop = threading.Event()

    def read():
        while not stop.is_set():
            for message in consumer:
                consumed.append(message.value)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    i = 0

    def produce(n):
        nonlocal i
        futures = []
        for _ in range(n):
            value = b"kp%08d" % i
            futures.append((value, producer.send("kp-drained", key=b"%d" % i, value=value)))
            i += 1
        for value, future in futures:
            try:
                future.get(60)
                sent.append(value)
            except Exception as exc:  # a delivery error surfaced to the application
                errors.append(exc)

    produce(500)
    cluster.wait_for(lambda: len(consumed) >= 500, timeout=60, what="the group consuming")
    # a group that consumes has a stored generation: "unchanged" compares two real ones
    generation = cluster.wait_for(lambda: group_state(cluster, group)[0],
                                  what="the group's generation stored")
    assert generation > 0
    cluster.nodes[victim].process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # producing through the stop
        produce(50)
    assert cluster.nodes[victim].process.wait(30) == 0
    produce(500)
    producer.close()
    cluster.wait_for(lambda: set(sent) <= set(consumed), timeout=60,
                     what="the group consuming every acknowledged message")
    assert group_state(cluster, group)[0] == generation, "the group's generation moved"
    stop.set()
    reader.join(30)
    consumer.close()
    assert not errors, errors[:5]
    got = consume_all(cluster.bootstrap, "kp-drained", 6, len(sent))
    values = collections.Counter(v for _, _, v in got)
    assert not [v for v, c in values.items() if c > 1], "duplicates"
    assert set(sent) <= set(values), "acknowledged messages lost"


def test_drain_moves_everything_off_and_undrain_gives_work_again(cluster):
    start_three(cluster)
    create_topic(cluster.bootstrap, "before-drain", 6)
    holder = cluster.coordinator()
    node = next(n for n in (1, 2, 3) if n != holder)
    assert led_by(cluster, node)
    out = mink_cli(cluster, "drain", str(node), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["moved"] > 0
    assert not led_by(cluster, node), "the drained node still leads partitions"
    for topic in ("before-drain", "__consumer_offsets"):
        streams = cluster.open_streams(topic)
        assert all(streams.get(p, (None,))[0] == leader != node
                   for p, (leader, _) in cluster.leaders(topic).items()), topic
    assert node in cluster.live_nodes(), "drain does not stop the node"
    # New work avoids it: a new topic, a rebalance, a restart of the node (the mark stays).
    create_topic(cluster.bootstrap, "while-drained", 6)
    assert all(leader != node for leader, _ in cluster.leaders("while-drained").values())
    assert mink_cli(cluster, "rebalance").returncode == 0
    assert not led_by(cluster, node)
    cluster.nodes[node].stop()
    cluster.start(node, coordinator_tick=TICK, lease_ttl=LEASE_TTL)
    cluster.wait_for(lambda: node in cluster.live_nodes(), what="the node back")
    status = mink_cli(cluster, "status", "--json")
    assert [n["draining"] for n in json.loads(status.stdout)["nodes"]
            if n["node_id"] == node] == ["operator"]
    create_topic(cluster.bootstrap, "after-restart", 3)
    assert all(leader != node for leader, _ in cluster.leaders("after-restart").values())
    # Undrained: a rebalance gives it its share, new topics include it.
    out = mink_cli(cluster, "undrain", str(node), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["moves"] > 0
    assert led_by(cluster, node), "the undrained node was given nothing"
    cluster.wait_for(lambda: all(
        cluster.open_streams("before-drain").get(p, (None,))[0] == leader
        for p, (leader, _) in cluster.leaders("before-drain").items()),
        what="moved partitions opened by their new leaders")
    create_topic(cluster.bootstrap, "after-undrain", 6)
    assert node in {leader for leader, _ in cluster.leaders("after-undrain").values()}


def test_rolling_restart_under_load_has_no_errors(cluster):
    """Every node in turn stopped with SIGTERM and started again, under an idempotent producer
    and a consuming group: no delivery error, nothing lost or duplicated, no rebalance."""
    start_three(cluster)
    create_topic(cluster.bootstrap, "rolling", 6)
    group = group_coordinated_by(cluster, 1)
    reader = GroupReader(cluster.bootstrap, "rolling", group)
    with Load(cluster.bootstrap, "rolling") as load:
        cluster.wait_for(lambda: len(reader.consumed) > 1000 and len(load.acked) > 2000,
                         timeout=60, what="producing and the group consuming")
        generation = cluster.wait_for(lambda: group_state(cluster, group)[0],
                                      what="the group's generation stored")
        for node_id in (1, 2, 3):
            assert cluster.nodes[node_id].stop() == 0
            cluster.start(node_id, coordinator_tick=TICK, lease_ttl=LEASE_TTL)
            cluster.wait_for(lambda: node_id in cluster.live_nodes(), what="the node back")
            acked = len(load.acked)
            cluster.wait_for(lambda: len(load.acked) > acked + 1000, timeout=60,
                             what="produce going on after the restart")
    assert not load.errors, load.errors[:5]
    cluster.wait_for(lambda: set(load.acked) <= set(reader.consumed), timeout=60,
                     what="the group consuming every acknowledged message")
    assert group_state(cluster, group)[0] == generation, "the group's generation moved"
    reader.close()
    assert not reader.errors, reader.errors[:5]
    got = consume_all(cluster.bootstrap, "rolling", 6, len(load.acked))
    values = collections.Counter(v for _, _, v in got)
    assert not [v for v, c in values.items() if c > 1], "duplicates"
    assert set(load.acked) <= set(values), "acknowledged messages lost"

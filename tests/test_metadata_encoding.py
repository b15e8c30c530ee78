"""The Metadata body encoder (mink/protocol/metadata_encoding.py), byte for byte against kio's
encoding of the same answer, for every version Mink advertises (issue 22)."""

from __future__ import annotations

import datetime
import random
import uuid

import pytest
from kio.schema.errors import ErrorCode

from mink.protocol.apis import ADVERTISED, ApiKey
from mink.protocol.messages import build, encode_body, nested, response_schema
from mink.protocol.metadata_encoding import FIRST_VERSION, LAST_VERSION, encode_metadata_body

OMITTED = -2147483648


def test_every_advertised_version_is_encoded():
    assert ADVERTISED[ApiKey.METADATA] == (FIRST_VERSION, LAST_VERSION)


def random_answer(rng: random.Random, version: int):
    brokers = [(i, f"node-{i}.example", 9092 + i, rng.choice([None, "rack-é"]))
               for i in range(rng.randint(0, 3))]
    topics = []
    for t in range(rng.randint(0, 5)):
        partitions = []
        for index in range(rng.randint(0, 6)):
            leader = rng.choice([-1, 1, 2, 300])
            replicas = () if leader == -1 else tuple(rng.sample(range(1, 9), rng.choice([1, 1, 3])))
            partitions.append((rng.choice([0, 5]), index, leader, rng.randint(-1, 2**31 - 1),
                               replicas))
        by_id = version >= 12 and rng.random() < 0.3
        topics.append((rng.choice([0, 3, 100]), None if by_id else f"topic-{t}",
                       uuid.UUID(int=rng.getrandbits(128)) if rng.random() < 0.8 else None,
                       rng.random() < 0.2, partitions, rng.choice([OMITTED, 0b11111000])))
    return {"throttle_ms": rng.randint(0, 1000), "brokers": brokers,
            "cluster_id": rng.choice([None, "cluster-x"]), "controller_id": rng.randint(-1, 3),
            "topics": topics, "cluster_authorized_operations": rng.choice([OMITTED, 0]),
            "error_code": rng.choice([0, 0, 7])}


def kio_answer(version: int, answer: dict):
    schema = response_schema(ApiKey.METADATA, version)
    broker, topic_schema = nested(schema, "MetadataResponseBroker"), nested(
        schema, "MetadataResponseTopic")
    partition = nested(schema, "MetadataResponsePartition")
    topics = tuple(build(
        topic_schema, error_code=ErrorCode(error), name=name,
        topic_id=topic_id or uuid.UUID(int=0), is_internal=internal,
        topic_authorized_operations=ops,
        partitions=tuple(build(partition, error_code=ErrorCode(p_error), partition_index=index,
                               leader_id=leader, leader_epoch=epoch, replica_nodes=replicas,
                               isr_nodes=replicas, offline_replicas=())
                         for p_error, index, leader, epoch, replicas in partitions))
        for error, name, topic_id, internal, partitions, ops in answer["topics"])
    return build(schema, throttle_time=datetime.timedelta(milliseconds=answer["throttle_ms"]),
                 brokers=tuple(build(broker, node_id=n, host=h, port=p, rack=r)
                               for n, h, p, r in answer["brokers"]),
                 cluster_id=answer["cluster_id"], controller_id=answer["controller_id"],
                 topics=topics,
                 cluster_authorized_operations=answer["cluster_authorized_operations"],
                 error_code=ErrorCode(answer["error_code"]))


@pytest.mark.parametrize("version", range(FIRST_VERSION, LAST_VERSION + 1))
def test_the_body_is_kios_byte_for_byte(version):
    for seed in range(60):
        answer = random_answer(random.Random(seed), version)
        if version < 12:  # names are not nullable before v12
            answer["topics"] = [(e, n or "unnamed", i, x, p, o)
                                for e, n, i, x, p, o in answer["topics"]]
        expected = encode_body(kio_answer(version, answer)).payload
        assert encode_metadata_body(version, **answer) == expected, f"v{version} seed {seed}"


@pytest.mark.parametrize("version", range(FIRST_VERSION, LAST_VERSION + 1))
def test_topics_encoded_before_are_taken_as_they_are(version):
    from mink.protocol.metadata_encoding import encode_metadata_topic

    rng = random.Random(version + 100)
    answer = random_answer(rng, version)
    whole = encode_metadata_body(version, **answer)
    mixed = [encode_metadata_topic(version, t) if i % 2 else t
             for i, t in enumerate(answer["topics"])]
    assert encode_metadata_body(version, **{**answer, "topics": mixed}) == whole


def test_the_handlers_topic_bytes_follow_changes_and_liveness():
    """The handler keeps each topic's bytes across snapshots made by deltas: an answer after
    a topic changed, or after its leader died, is the one a fresh view gives."""
    from mink.broker.cluster.view import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
    from mink.broker.server.handlers.metadata import _encoded

    def topic(name, leaders, epoch=0, topic_id=None):
        return TopicInfo(topic_id or uuid.uuid4(), name,
                         tuple(PartitionInfo(i, n, epoch) for i, n in enumerate(leaders)))

    brokers = {n: BrokerInfo(n, "h", 9000 + n) for n in (1, 2)}
    a, b = topic("a", [1, 2]), topic("b", [2, 2, 1])
    view = ClusterView(version=1, cluster_id="c", brokers=brokers, topics={"a": a, "b": b})

    def fresh(v: ClusterView) -> ClusterView:
        return ClusterView(version=v.version, cluster_id="c", brokers=v.brokers,
                           topics=dict(v.topics), listed_brokers=v.listed_brokers)

    for version in (1, 12):
        assert _encoded(view, version, None, True) == _encoded(fresh(view), version, None, True)
    moved = view.with_changes(2, brokers, None, {}, [a.topic_id],
                              [topic("a", [2, 2], 1, a.topic_id)])
    assert moved.derived["topic_bytes"] is view.derived["topic_bytes"]
    assert _encoded(moved, 12, None, True) == _encoded(fresh(moved), 12, None, True)
    assert _encoded(moved, 12, None, True) != _encoded(view, 12, None, True)
    dead = moved.with_changes(3, {1: brokers[1]}, None, {}, [], [])  # node 2 died
    assert _encoded(dead, 12, None, True) == _encoded(fresh(dead), 12, None, True)
    assert _encoded(dead, 1, None, True) == _encoded(fresh(dead), 1, None, True)

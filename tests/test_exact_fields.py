"""Client strings and bytes round-trip exactly through PostgreSQL, NUL and non-ASCII included:
commit metadata (confluent-kafka sends it with a trailing NUL; it used to fail with
UNKNOWN_SERVER_ERROR and be re-sent forever), group, member and instance ids, client ids,
protocol names, topic configs; byte fields (protocol metadata, assignments) byte for byte."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from mink.storage.controlplane.groups import (
    Fence,
    GroupStore,
    StoredGroup,
    StoredMember,
    StoredOffset,
)
from tests.support.metadata import ToolMetadataStore
from mink.storage.pgtext import CorruptText, from_pg, to_pg
from tests.support.nodes import node_config, start_node

# NUL, our escape character, a literal "\u0000", non-ASCII, astral plane.
AWKWARD = "a\x00b\x01c\x01\x01\x010\\u0000 ünïcødé ☃ \U0001f600\x00"
AWKWARD_BYTES = bytes(range(256)) + b"\x00\x00"


@given(st.text())
def test_pgtext_round_trips_any_string(value):
    stored = to_pg(value)
    assert "\x00" not in stored and from_pg(stored) == value


@given(st.text(), st.text())
def test_pgtext_keeps_strings_apart(a, b):
    assert (to_pg(a) == to_pg(b)) == (a == b)


def test_pgtext_leaves_plain_strings_alone_and_refuses_what_it_cannot_have_written():
    assert to_pg("my-group ü") == "my-group ü"
    for bad in ("\x01", "x\x01y", "\x01\x02"):
        with pytest.raises(CorruptText):
            from_pg(bad)


# -- storage, a test per field ------------------------------------------------------------

MEMBER_FIELDS = ["member_id", "group_instance_id", "client_id", "client_host",
                 "protocol_type", "protocol_name", "protocol_metadata", "assignment"]
GROUP_FIELDS = ["group_id", "group_protocol_type", "group_protocol_name", "leader"]
OFFSET_FIELDS = ["offset_topic", "offset_metadata"]


def stored_group(field: str) -> StoredGroup:
    def text(name: str, default: str) -> str:
        return AWKWARD if field == name else default

    member = StoredMember(
        text("member_id", "m-1"), text("group_instance_id", "i-1"), text("client_id", "c"),
        text("client_host", "/127.0.0.1"), 300000, 6000, text("protocol_type", "consumer"),
        [(text("protocol_name", "range"),
          AWKWARD_BYTES if field == "protocol_metadata" else b"meta")],
        AWKWARD_BYTES if field == "assignment" else b"assigned")
    return StoredGroup(text("group_id", "g"), text("group_protocol_type", "consumer"),
                       text("group_protocol_name", "range"), 3, text("leader", "m-1"),
                       [member])


@pytest.mark.parametrize("field", GROUP_FIELDS + MEMBER_FIELDS + OFFSET_FIELDS)
async def test_group_field_round_trips_exactly(pg_url, aio_loop, field):
    store = await ToolMetadataStore.open(pg_url)
    try:
        node_epoch = await store.register_node(1, "127.0.0.1", 9092, ttl_s=30)
        topic = await store.create_topic("__consumer_offsets", 1, {}, [1])
        groups = GroupStore(store)
        fence = Fence(topic.topic_id, 0, 0, 1, node_epoch)
        group = stored_group(field)
        offset = StoredOffset(AWKWARD if field == "offset_topic" else "t", 0, 42, 1,
                              AWKWARD if field == "offset_metadata" else "meta")
        await groups.commit_offsets(fence, group.group_id, [offset])
        await groups.store_group(fence, group)
        [loaded] = await groups.load(0)
        assert loaded.members == group.members
        assert (loaded.group_id, loaded.protocol_type, loaded.protocol_name, loaded.leader) == (
            group.group_id, group.protocol_type, group.protocol_name, group.leader)
        assert [(o.topic, o.metadata) for o in loaded.offsets] == [(offset.topic,
                                                                    offset.metadata)]
        # deletes find the rows by the same strings
        await groups.delete_offsets(fence, group.group_id, [(offset.topic, 0)])
        assert (await groups.load(0))[0].offsets == []
        await groups.delete_groups(fence, [group.group_id])
        assert await groups.load(0) == []
    finally:
        await store.aclose()


async def test_topic_config_round_trips_exactly(pg_url, aio_loop):
    store = await ToolMetadataStore.open(pg_url)
    try:
        config = {"compression.type": AWKWARD, "retention.ms": "1000"}
        created = await store.create_topic("awkward-config", 1, config, [None])
        assert created.config == config
        assert (await store.get_topic("awkward-config")).config == config
        assert [t.config for t in await store.get_topics()] == [config]
        [view_topic] = (await store.view()).topics
        assert view_topic.config == config
    finally:
        await store.aclose()


# -- the clients ----------------------------------------------------------------------------


@pytest.fixture
async def group_node(nursery, pg_url, store_url) -> str:
    """A node with the topic "meta-topic" (commits to unknown topics are refused)."""
    from confluent_kafka import Producer

    node = await start_node(nursery, node_config(pg_url, store_url, num_partitions=1,
                                                 offsets_topic_num_partitions=4,
                                                 group_initial_rebalance_delay_ms=0))

    def make_topic():
        producer = Producer({"bootstrap.servers": node})
        producer.produce("meta-topic", b"x")
        assert producer.flush(30) == 0

    await trio.to_thread.run_sync(make_topic)
    return node


async def test_confluent_commit_metadata_hello_world_round_trips(group_node):
    """librdkafka sends the metadata string with its trailing NUL."""
    from confluent_kafka import Consumer, TopicPartition

    def run():
        consumer = Consumer({"bootstrap.servers": group_node, "group.id": "meta-confluent",
                             "enable.auto.commit": False})
        try:
            commit = TopicPartition("meta-topic", 0, 5, metadata="hello world")
            [result] = consumer.commit(offsets=[commit], asynchronous=False)
            assert result.error is None, result.error
            [got] = consumer.committed([TopicPartition("meta-topic", 0)], timeout=30)
            return got.offset, got.metadata, got.error
        finally:
            consumer.close()

    with trio.fail_after(90):
        offset, metadata, error = await trio.to_thread.run_sync(run)
    assert (offset, metadata, error) == (5, "hello world", None)


async def test_kafka_python_commit_metadata_round_trips_any_characters(group_node):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    def run():
        consumer = KafkaConsumer(bootstrap_servers=group_node, group_id="meta-kafka-python",
                                 enable_auto_commit=False)
        try:
            partition = TopicPartition("meta-topic", 0)
            consumer.commit({partition: OffsetAndMetadata(7, AWKWARD, -1)})
            return consumer.committed(partition, metadata=True)
        finally:
            consumer.close()

    with trio.fail_after(90):
        got = await trio.to_thread.run_sync(run)
    assert (got.offset, got.metadata) == (7, AWKWARD)

"""cleanup.policy=compact, compact,delete and empty: accepted at creation and by the config APIs,
a keyless record refused (INVALID_RECORD for its batch, as Kafka's LogValidator), retention by
time or size only where the policy includes delete. Stock clients against a live node."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from mink.broker.topics.config import (
    InvalidConfig,
    altered_topic_config,
    deletes_by_retention,
    is_compacted,
    topic_setting,
    validate_topic_config,
)
from mink.client import KafkaClient
from mink.protocol.records import Record
from tests.support.batches import records_batch
from tests.test_admin_apis import TIMEOUT, confluent_admin, error_of, in_thread
from tests.test_produce_validation import fetch_batches, kafka_python_read, produce

INVALID_RECORD = 87


# -- the settings, as pure functions ------------------------------------------------------------

@pytest.mark.parametrize("policy, compacted, deletes", [
    ("compact", True, False),
    ("delete", False, True),
    ("compact,delete", True, True),
    ("delete, compact", True, True),
    ("", False, False),  # Kafka (documented from 4.1): the log is kept whole
])
def test_cleanup_policies_accepted(policy, compacted, deletes):
    stored = validate_topic_config({"cleanup.policy": policy})
    assert is_compacted(stored) is compacted
    assert deletes_by_retention(stored) is deletes
    assert topic_setting(stored, "cleanup.policy") == {"compact", "delete"} & {
        p.strip() for p in policy.split(",")}


def test_default_policy_is_delete():
    assert not is_compacted({}) and deletes_by_retention({})


@pytest.mark.parametrize("configs", [
    {"cleanup.policy": "shred"},
    {"cleanup.policy": "compact,shred"},
    {"min.cleanable.dirty.ratio": "1.5"},
    {"min.cleanable.dirty.ratio": "half"},
    {"delete.retention.ms": "-1"},
    {"min.compaction.lag.ms": "soon"},
    {"max.compaction.lag.ms": "0"},
])
def test_bad_compaction_settings_refused(configs):
    with pytest.raises(InvalidConfig):
        validate_topic_config(configs)


def test_compaction_settings_defaults_are_kafkas():
    assert topic_setting({}, "delete.retention.ms") == 86_400_000
    assert topic_setting({}, "min.compaction.lag.ms") == 0
    assert topic_setting({}, "max.compaction.lag.ms") == 2**63 - 1
    assert topic_setting({}, "min.cleanable.dirty.ratio") == 0.5


def test_incremental_alter_appends_compact():
    altered = altered_topic_config({}, [("APPEND", "cleanup.policy", "compact")])
    assert altered["cleanup.policy"] == "delete,compact"
    assert is_compacted(altered) and deletes_by_retention(altered)
    altered = altered_topic_config(altered, [("SUBTRACT", "cleanup.policy", "delete")])
    assert is_compacted(altered) and not deletes_by_retention(altered)
    # down to the empty list, which stays empty (not the default) for the next change
    altered = altered_topic_config(altered, [("SUBTRACT", "cleanup.policy", "compact")])
    assert altered["cleanup.policy"] == ""
    assert not is_compacted(altered) and not deletes_by_retention(altered)
    altered = altered_topic_config(altered, [("APPEND", "cleanup.policy", "compact")])
    assert altered["cleanup.policy"] == "compact"
    with pytest.raises(InvalidConfig):
        altered_topic_config(altered, [("APPEND", "cleanup.policy", "shred")])
    # a SET of nothing (back to the default) then an APPEND in one request: from the default
    assert altered_topic_config(altered, [("SET", "cleanup.policy", None),
                                          ("APPEND", "cleanup.policy", "compact")]) == {
        "cleanup.policy": "delete,compact"}


# -- on a live node -----------------------------------------------------------------------------

def _create(address: str, topics: dict[str, dict[str, str]]) -> dict[str, int | None]:
    from confluent_kafka.admin import NewTopic

    admin = confluent_admin(address)
    futures = admin.create_topics([NewTopic(n, 1, 1, config=c) for n, c in topics.items()],
                                  operation_timeout=TIMEOUT)
    return {name: error_of(f) for name, f in futures.items()}


def _describe(address: str, topic: str) -> dict[str, str]:
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic)
    admin = confluent_admin(address)  # kept: its futures fail once it is destroyed
    entries = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT)
    return {name: entry.value for name, entry in entries.items()}


def _produce(address: str, topic: str, items: list[tuple[bytes | None, bytes]]) -> list:
    """Each item's delivery: its offset, or the KafkaError code."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "linger.ms": 0, "retries": 0,
                         "allow.auto.create.topics": False})
    outcomes: list = []

    def on_delivery(err, msg):
        outcomes.append(err.code() if err else msg.offset())

    for key, value in items:
        producer.produce(topic, key=key, value=value, partition=0, on_delivery=on_delivery)
        assert producer.flush(TIMEOUT) == 0  # one batch each: a refusal is that record's
    return outcomes


async def test_compacted_topics_created_and_described(node):
    outcome = await in_thread(_create, node, {
        "changelog": {"cleanup.policy": "compact", "delete.retention.ms": "1000",
                      "min.cleanable.dirty.ratio": "0.1", "min.compaction.lag.ms": "5"},
        "both": {"cleanup.policy": "compact,delete"},
        "neither": {"cleanup.policy": "archive"},
    })
    assert outcome == {"changelog": None, "both": None, "neither": ErrorCode.invalid_config}
    described = await in_thread(_describe, node, "changelog")
    assert described["cleanup.policy"] == "compact"
    assert described["delete.retention.ms"] == "1000"
    assert described["min.cleanable.dirty.ratio"] == "0.1"
    assert described["min.compaction.lag.ms"] == "5"
    assert described["max.compaction.lag.ms"] == str(2**63 - 1)
    assert (await in_thread(_describe, node, "both"))["cleanup.policy"] == "compact,delete"


async def test_keyless_records_refused_on_compacted_topics(node):
    assert await in_thread(_create, node, {"keyed": {"cleanup.policy": "compact"},
                                           "plain": {}}) == {"keyed": None, "plain": None}
    outcomes = await in_thread(_produce, node, "keyed", [(b"k1", b"a"), (None, b"b"),
                                                         (b"k2", b"c")])
    # librdkafka reports INVALID_RECORD for the keyless one; the others are written
    assert outcomes == [0, INVALID_RECORD, 1]
    assert await in_thread(_produce, node, "plain", [(None, b"a"), (b"k", b"b")]) == [0, 1]


async def test_keyless_record_error_names_the_record(node):
    assert await in_thread(_create, node, {"keyed-raw": {"cleanup.policy": "compact,delete"}}
                           ) == {"keyed-raw": None}
    client = await KafkaClient.connect(node)
    try:
        records = [Record(0, 0, b"k", b"a"), Record(1, 0, None, b"b"), Record(2, 0, b"k", b"c")]
        result = await produce(client, "keyed-raw", records_batch(records))
        assert int(result.error_code) == INVALID_RECORD
        assert [e.batch_index for e in result.record_errors] == [1]
        assert "without key" in result.record_errors[0].batch_index_error_message
        # nothing of the refused batch is stored: the next one takes offset 0
        good = await produce(client, "keyed-raw", records_batch([Record(0, 0, b"k", b"z")]))
        assert int(good.error_code) == 0 and good.base_offset == 0
        assert [kafka_python_read(b) for b in await fetch_batches(client, "keyed-raw")] == [
            [(0, b"k", b"z")]]
    finally:
        await client.aclose()


def _alter(address: str, topic: str, policy: str) -> int | None:
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("cleanup.policy", policy,
                    incremental_operation=AlterConfigOpType.SET)])
    admin = confluent_admin(address)
    return error_of(admin.incremental_alter_configs([resource])[resource])


async def test_policy_altered_to_compact_applies_to_the_next_batch(node):
    assert await in_thread(_create, node, {"later": {}}) == {"later": None}
    assert await in_thread(_produce, node, "later", [(None, b"a")]) == [0]
    assert await in_thread(_alter, node, "later", "compact") is None
    assert await in_thread(_alter, node, "later", "compact,wipe") == ErrorCode.invalid_config

    async def refused() -> bool:
        return await in_thread(_produce, node, "later", [(None, b"b")]) == [INVALID_RECORD]

    # the view carries the change to the produce path; wait for it, bounded
    import trio
    with trio.fail_after(TIMEOUT):
        while not await refused():
            await trio.sleep(0.2)
    assert (await in_thread(_describe, node, "later"))["cleanup.policy"] == "compact"


# -- retention: only where the policy includes delete --------------------------------------------

def _watermarks(address: str, topic: str) -> tuple[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": address, "group.id": "unused"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT)
    finally:
        consumer.close()


def _produce_old(address: str, topic: str, n: int) -> None:
    import time

    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "linger.ms": 0})
    old = int(time.time() * 1000) - 3_600_000
    for i in range(n):
        producer.produce(topic, key=b"k%d" % i, value=b"v", partition=0, timestamp=old)
        producer.flush(TIMEOUT)


async def test_retention_applies_to_compact_delete_only(mink_postgres, tmp_path):
    import trio

    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=(tmp_path).as_uri(), proxy=False,
                         log_retention_check_interval_ms=200, log_cleaner_backoff_ms=-1
                         ) as running:
        address = running.bootstrap
        assert await in_thread(_create, address, {
            "compact-only": {"cleanup.policy": "compact", "retention.ms": "1000"},
            "compact-delete": {"cleanup.policy": "compact,delete", "retention.ms": "1000"},
            "keep-all": {"cleanup.policy": "", "retention.ms": "1000"},
        }) == {"compact-only": None, "compact-delete": None, "keep-all": None}
        assert (await in_thread(_describe, address, "keep-all"))["cleanup.policy"] == ""
        for topic in ("compact-only", "compact-delete", "keep-all"):
            await in_thread(_produce_old, address, topic, 3)

        with trio.fail_after(TIMEOUT):  # retention empties compact,delete ...
            while await in_thread(_watermarks, address, "compact-delete") != (3, 3):
                await trio.sleep(0.2)
        # ... in the rounds that would have emptied compact-only and keep-all too
        for _ in range(3):
            await trio.sleep(0.2)
            assert await in_thread(_watermarks, address, "compact-only") == (0, 3)
            assert await in_thread(_watermarks, address, "keep-all") == (0, 3)


def test_the_dedupe_buffer_size_is_a_node_setting_of_at_least_1_mib():
    from mink.broker.config import ConfigError, load_config

    assert load_config(env={}).log_cleaner_dedupe_buffer_size == 128 * 1024 * 1024
    assert load_config(env={"MINK_LOG_CLEANER_DEDUPE_BUFFER_SIZE": "2097152"}
                       ).log_cleaner_dedupe_buffer_size == 2 * 1024 * 1024
    with pytest.raises(ConfigError, match="at least"):
        load_config(env={"MINK_LOG_CLEANER_DEDUPE_BUFFER_SIZE": "1000"})

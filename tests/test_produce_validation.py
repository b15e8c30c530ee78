"""No poison batches: a live node refuses every Produce batch Kafka's LogValidator refuses,
with Kafka's error code, and whatever it acknowledges every consumer can read.

The named regression tests are the cases a protocol fuzzer found acknowledged with error 0
(valid CRC over bad records): before validation, each was stored and stalled librdkafka
consumers at its offset. The hypothesis test at the end is that fuzzer, in the suite.
"""

from __future__ import annotations

import datetime
import logging
import resource
import threading
import time

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch
from kio.index import load_request_schema

from mink.client import KafkaClient
from mink.protocol import compression as codecs
from mink.protocol.messages import build, nested
from mink.protocol.records import Record, encode_records, iter_batches, iter_records
from tests.support import bombs, readers
from tests.support.batches import records_batch, values, wrap_section
from tests.support.nodes import node_config, require_tool, start_node
from tests.support.raw import produce_request

CODECS = [codecs.NONE, codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD]
CORRUPT_MESSAGE, INVALID_TIMESTAMP, INVALID_RECORD = 2, 32, 87


async def produce(client: KafkaClient, topic: str, batch: bytes, version: int = 9):
    response = await client.call(0, version, produce_request(topic, 0, batch, version=version))
    return response.responses[0].partition_responses[0]


async def fetch_batches(client: KafkaClient, topic: str, offset: int = 0) -> list[bytes]:
    """Every stored batch of partition 0 from `offset`, as a consumer receives them."""
    schema = load_request_schema(1, 12)
    partition = build(nested(schema, "FetchPartition"), partition=0, fetch_offset=offset,
                      partition_max_bytes=64 << 20)
    request = build(schema, max_wait=datetime.timedelta(milliseconds=10), min_bytes=1,
                    topics=(build(nested(schema, "FetchTopic"), topic=topic,
                                  partitions=(partition,)),),
                    forgotten_topics_data=())
    response = await client.call(1, 12, request)
    data = response.responses[0].partitions[0]
    assert int(data.error_code) == 0, data
    return [bytes(batch) for _, batch in iter_batches(data.records or b"")]


def kafka_python_read(batch: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    """kafka-python's record-batch reader: CRC checked, every record read, exactly."""
    reader = DefaultRecordBatch(batch)
    assert reader.validate_crc()
    return [(r.offset, r.key, r.value) for r in reader]


def read_alike(batch: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    """kafka-python's reading of `batch`, having checked that aiokafka's reader reads the
    same and that both read what Kafka reads (Mink's decoding, as DefaultRecord.readFrom)."""
    base = DefaultRecordBatch(batch).base_offset
    as_kafka = [(base + r.offset_delta, r.key, r.value, list(r.headers))
                for r in iter_records(batch)]
    assert readers.kafka_python_records(batch) == as_kafka, "kafka-python reads otherwise"
    assert readers.aiokafka_records(batch) == as_kafka, "aiokafka reads otherwise"
    return [(offset, key, value) for offset, key, value, _ in as_kafka]


async def refuse_then_serve(node: str, topic: str, bad: bytes, codes: set[int]) -> None:
    """`bad` is refused with one of `codes`; nothing of it is stored: a good batch after it
    takes offset 0 and is all a consumer reads."""
    client = await KafkaClient.connect(node)
    try:
        result = await produce(client, topic, bad)
        assert int(result.error_code) in codes, result
        assert result.error_message, "a refusal says why"
        good = await produce(client, topic, records_batch(values(2)))
        assert int(good.error_code) == 0 and good.base_offset == 0
        stored = await fetch_batches(client, topic)
        assert [kafka_python_read(b) for b in stored] == [
            [(0, None, values(2)[0].value), (1, None, values(2)[1].value)]]
    finally:
        await client.aclose()


# -- named regression tests (each was acknowledged with error 0 before validation) ----


async def test_regression_valid_crc_over_garbage_records(node):
    await refuse_then_serve(node, "garbage-records",
                            wrap_section(b"\x13\x00not records at all, but the CRC is fine", 2),
                            {INVALID_RECORD})


@pytest.mark.parametrize("codec", CODECS[1:], ids=codecs.CODEC_NAMES.get)
async def test_regression_garbage_compressed_payload(node, codec):
    await refuse_then_serve(node, "garbage-payload",
                            wrap_section(b"\x00\x01\x02 garbage, not compressed " * 4, 3,
                                         compression=codec),
                            {CORRUPT_MESSAGE})


async def test_regression_wrong_last_offset_delta(node):
    # Header: lastOffsetDelta 2 for 3 records; the records say 0, 1, 5.
    records = [Record(0, 0, None, b"a"), Record(1, 0, None, b"b"), Record(5, 0, None, b"c")]
    await refuse_then_serve(node, "wrong-delta", records_batch(records, last_offset_delta=2),
                            {INVALID_RECORD})


@pytest.mark.parametrize("count", [2, 6])
async def test_regression_wrong_record_count(node, count):
    # Four records, and a header (count and lastOffsetDelta agreeing) claiming `count`.
    await refuse_then_serve(node, "wrong-count",
                            wrap_section(encode_records(values(4)), count), {INVALID_RECORD})


@pytest.mark.parametrize("where", ["record_size", "key_length", "value_length",
                                   "header_count"])
async def test_regression_bad_lengths(node, where):
    section = bytearray(encode_records([Record(0, 0, b"key", b"value", (("h", b"v"),))]))
    # [size][attributes][timestampDelta][offsetDelta][keyLength]key[valueLength]value[count]..
    position = {"record_size": 0, "key_length": 4, "value_length": 8, "header_count": 14}
    section[position[where]] += 2 * 9  # nine bytes more than there are (zigzag: 2 per unit)
    await refuse_then_serve(node, "bad-lengths", wrap_section(bytes(section), 1),
                            {INVALID_RECORD})


def _one_record_with_attributes(attributes: int) -> bytes:
    section = bytearray(encode_records([Record(0, 0, b"k", b"value")]))
    section[1] = attributes  # after the one-byte record length
    return bytes(section)


@pytest.mark.parametrize("codec", [codecs.NONE, codecs.ZSTD], ids=codecs.CODEC_NAMES.get)
async def test_regression_record_attributes_with_the_top_bit(node, codec):
    # Acknowledged before: kafka-python and aiokafka read the attributes byte as a varint and
    # misread the record (found by the fuzz test in a damaged zstd payload).
    await refuse_then_serve(node, "record-attributes",
                            wrap_section(codecs.compress(codec, _one_record_with_attributes(0x80)),
                                         1, compression=codec), {INVALID_RECORD})


async def test_regression_xerial_header_other_than_version_1_1(node):
    # Acknowledged before: aiokafka decodes a stream whose header is not snappy-java's 1/1 as
    # raw snappy and fails on it.
    section = bytearray(codecs.compress(codecs.SNAPPY, encode_records(values(2))))
    section[8:16] = (1).to_bytes(4, "little") * 2
    await refuse_then_serve(node, "xerial-header",
                            wrap_section(bytes(section), 2, compression=codecs.SNAPPY),
                            {CORRUPT_MESSAGE})


@pytest.mark.parametrize("framing", ["two-frames", "dependent-blocks"])
async def test_regression_lz4_framing_kafka_readers_refuse(node, framing):
    # Acknowledged before: cramjam reads both, but kafka-python's lz4 reads the first frame
    # only and librdkafka refuses bytes after it; Kafka refuses dependent blocks (KIP-57),
    # which Java consumers cannot read.
    import cramjam
    import lz4.frame

    section = encode_records(values(2))
    half = len(encode_records(values(1)))
    payload = (lz4.frame.compress(section[:half], block_linked=False)
               + lz4.frame.compress(section[half:], block_linked=False)
               if framing == "two-frames" else bytes(cramjam.lz4.compress(section)))
    await refuse_then_serve(node, f"lz4-{framing}",
                            wrap_section(payload, 2, compression=codecs.LZ4), {CORRUPT_MESSAGE})


async def test_regression_gzip_records_over_two_members(node):
    # Acknowledged before: librdkafka inflates the first member only, and its consumers
    # skipped the second member's records without an error.
    import gzip

    section = encode_records(values(2))
    half = len(encode_records(values(1)))
    payload = gzip.compress(section[:half]) + gzip.compress(section[half:])
    await refuse_then_serve(node, "gzip-members",
                            wrap_section(payload, 2, compression=codecs.GZIP), {CORRUPT_MESSAGE})


def _payloads_every_client_reads() -> list[tuple[int, bytes, int]]:
    """(codec, payload, count): the framings Mink accepts beyond the plain ones."""
    import cramjam
    import zstandard

    first, second = values(2), [r._replace(offset_delta=r.offset_delta + 2) for r in values(2)]
    both = encode_records(first + second)
    half = len(encode_records(first))
    skippable = (0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    zstd = zstandard.ZstdCompressor

    def xerial(*blocks: bytes) -> bytes:
        out = bytearray(b"\x82SNAPPY\x00" + (1).to_bytes(4, "big") * 2)
        for block in blocks:
            compressed = bytes(cramjam.snappy.compress_raw(block))
            out += len(compressed).to_bytes(4, "big") + compressed
        return bytes(out)

    return [
        (codecs.ZSTD, zstd().compress(both[:half]) + zstd().compress(both[half:]), 4),
        (codecs.ZSTD, skippable + zstd(write_checksum=True).compress(both) + skippable, 4),
        (codecs.ZSTD, zstd(write_content_size=False).compress(both) + zstd().compress(b""), 4),
        (codecs.SNAPPY, bytes(cramjam.snappy.compress_raw(both)), 4),  # as librdkafka writes
        (codecs.SNAPPY, xerial(both[:half], b"", both[half:]), 4),
        (codecs.NONE, _one_record_with_attributes(0x7F), 1),
        (codecs.LZ4, codecs.compress(codecs.LZ4, both), 4),  # Mink's own: independent blocks
    ]


async def test_framings_mink_accepts_are_read_by_every_client(node):
    """librdkafka (confluent-kafka and kcat) over the wire, kafka-python and aiokafka on the
    fetched batches: the zstd and snappy framings the validator lets through read alike."""
    client = await KafkaClient.connect(node)
    topic, expected = "framings", []
    try:
        for codec, payload, count in _payloads_every_client_reads():
            batch = wrap_section(payload, count, compression=codec)
            result = await produce(client, topic, batch)
            assert int(result.error_code) == 0, (codecs.CODEC_NAMES[codec], result)
            expected += [(k, v) for _, k, v in read_alike(batch)]
        stored = [r for b in await fetch_batches(client, topic) for r in read_alike(b)]
        assert [(k, v) for _, k, v in stored] == expected
    finally:
        await client.aclose()
    got = await trio.to_thread.run_sync(confluent_read_all, node, topic, len(expected))
    assert [(k, v) for _, k, v in got] == expected
    kcat = require_tool("kcat")
    with trio.fail_after(30):
        listed = await trio.run_process(
            [kcat, "-b", node, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q",
             "-f", "%o\\n"], capture_stdout=True, capture_stderr=True)
    assert listed.stdout.decode().split() == [str(i) for i in range(len(expected))]
    assert b"ERROR" not in listed.stderr.upper(), listed.stderr


async def test_time_index_uses_the_computed_max_timestamp(node):
    client = await KafkaClient.connect(node)
    base = int(time.time() * 1000) - 60_000
    records = [Record(0, 0, None, b"a"), Record(1, 30_000, None, b"b"), Record(2, 5, None, b"c")]
    # The client claims maxTimestamp = base: a lie the time index must not believe.
    result = await produce(client, "max-ts", records_batch(records, base_timestamp=base,
                                                           max_timestamp=base))
    assert int(result.error_code) == 0
    schema = load_request_schema(2, 7)
    request = build(schema, replica_id=-1, isolation_level=0, topics=(
        build(nested(schema, "ListOffsetsTopic"), name="max-ts", partitions=(
            build(nested(schema, "ListOffsetsPartition"), partition_index=0,
                  current_leader_epoch=-1, timestamp=-3),)),))  # -3: the max timestamp
    answer = (await client.call(2, 7, request)).topics[0].partitions[0]
    assert (answer.offset, answer.timestamp) == (1, base + 30_000)
    [stored] = await fetch_batches(client, "max-ts")
    assert DefaultRecordBatch(stored).max_timestamp == base + 30_000
    assert DefaultRecordBatch(stored).validate_crc()
    await client.aclose()


async def test_record_errors_reach_the_client(pg_url, store_url, nursery):
    node = await start_node(nursery, node_config(pg_url, store_url))
    client = await KafkaClient.connect(node)
    now = int(time.time() * 1000)
    records = [Record(0, 0, None, b"a"), Record(1, 0, None, b"b"), Record(9, 0, None, b"c")]
    result = await produce(client, "record-errors", records_batch(records, last_offset_delta=2,
                                                                  base_timestamp=now))
    assert int(result.error_code) == INVALID_RECORD
    assert [e.batch_index for e in result.record_errors] == [2]
    assert "offsetDelta 9" in result.record_errors[0].batch_index_error_message
    await client.aclose()


# -- the fuzzer ---------------------------------------------------------------------------

record_strategy = st.builds(
    Record, st.just(0), st.integers(-1000, 1000), st.none() | st.binary(max_size=12),
    st.none() | st.binary(max_size=40),
    st.lists(st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=6)), max_size=2))


@st.composite
def fuzz_cases(draw) -> tuple[str, bytes, set[int]]:
    """(kind, batch, the codes Kafka may answer). 0 in the set: accepted if it is valid."""
    records = draw(st.lists(record_strategy, min_size=1, max_size=6))
    records = [r._replace(offset_delta=i) for i, r in enumerate(records)]
    codec = draw(st.sampled_from(CODECS))
    now = int(time.time() * 1000)
    kind = draw(st.sampled_from(["valid", "crc", "records", "payload", "garbage_payload",
                                 "count", "offset_deltas", "attributes", "xerial_header",
                                 "framing"]))
    if kind == "valid":
        return kind, records_batch(records, compression=codec, base_timestamp=now), {0}
    if kind == "crc":
        batch = bytearray(records_batch(records, compression=codec, base_timestamp=now))
        batch[draw(st.integers(21, len(batch) - 1))] ^= draw(st.integers(1, 255))
        return kind, bytes(batch), {CORRUPT_MESSAGE}
    if kind == "count":
        count = draw(st.integers(1, 10).filter(lambda n: n != len(records)))
        section = codecs.compress(codec, encode_records(records))
        return kind, wrap_section(section, count, compression=codec, base_timestamp=now), {
            INVALID_RECORD}
    if kind == "offset_deltas":
        shuffled = [r._replace(offset_delta=draw(st.integers(0, 8))) for r in records]
        if [r.offset_delta for r in shuffled] == list(range(len(shuffled))):
            shuffled[-1] = shuffled[-1]._replace(offset_delta=len(shuffled) + 3)
        return kind, records_batch(shuffled, compression=codec, base_timestamp=now,
                                   last_offset_delta=len(shuffled) - 1), {INVALID_RECORD}
    if kind == "garbage_payload":
        codec = draw(st.sampled_from(CODECS[1:]))
        garbage = draw(st.binary(min_size=1, max_size=80))
        return kind, wrap_section(garbage, len(records), compression=codec,
                                  base_timestamp=now), {0, CORRUPT_MESSAGE, INVALID_RECORD}
    if kind == "attributes":
        # A record's attributes byte (unused in v2): any value to Java and librdkafka, a
        # varint to kafka-python and aiokafka, so one with the top bit set they misread.
        section = bytearray(encode_records(records))
        position, index = 0, draw(st.integers(0, len(records) - 1))
        for _ in range(index):
            length, size_bytes = _varint_at(section, position)
            position += size_bytes + length
        position += _varint_at(section, position)[1]
        section[position] = draw(st.integers(0, 255))
        return kind, wrap_section(codecs.compress(codec, bytes(section)), len(records),
                                  compression=codec, base_timestamp=now), {0, INVALID_RECORD}
    if kind == "xerial_header":
        # Version and compatible version of snappy-java's framing: aiokafka takes the stream
        # for xerial only when they are 1 and 1 (big-endian) and fails on any other.
        section = bytearray(codecs.compress(codecs.SNAPPY, encode_records(records)))
        for position in draw(st.lists(st.integers(8, 15), min_size=1, max_size=3)):
            section[position] = draw(st.sampled_from([0, 1, 2, 0x80, 0xFF]))
        return kind, wrap_section(bytes(section), len(records), compression=codecs.SNAPPY,
                                  base_timestamp=now), {0, CORRUPT_MESSAGE}
    if kind == "framing":
        # Framings a decoder takes but some Kafka reader does not: records over two zstd or
        # LZ4 frames or gzip members, skippable frames, LZ4's dependent blocks.
        import cramjam
        import zstandard

        section = encode_records(records)
        cut = draw(st.integers(0, len(section)))
        skippable = (0x184D2A50).to_bytes(4, "little") + (2).to_bytes(4, "little") + b"sk"
        codec = draw(st.sampled_from([codecs.ZSTD, codecs.LZ4, codecs.GZIP]))
        frame = (zstandard.ZstdCompressor().compress if codec == codecs.ZSTD
                 else lambda data: codecs.compress(codec, data))
        how = draw(st.sampled_from(["split", "skippable-first", "skippable-last", "dependent"]))
        if how == "split":
            payload = frame(section[:cut]) + frame(section[cut:])
        elif how == "skippable-first":
            payload = skippable + frame(section)
        elif how == "skippable-last":
            payload = frame(section) + skippable
        else:
            codec, payload = codecs.LZ4, bytes(cramjam.lz4.compress(section))
        return kind, wrap_section(payload, len(records), compression=codec,
                                  base_timestamp=now), {0, CORRUPT_MESSAGE}
    # "records" mangles the uncompressed section, "payload" the compressed one; CRC fixed.
    if kind == "records":
        codec = codecs.NONE
    section = bytearray(codecs.compress(codec, encode_records(records)))
    for _ in range(draw(st.integers(1, 4))):
        section[draw(st.integers(0, len(section) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        section = section[: draw(st.integers(0, len(section)))] + draw(st.binary(max_size=4))
    codes = {0, INVALID_RECORD} if codec == codecs.NONE else {0, CORRUPT_MESSAGE,
                                                             INVALID_RECORD}
    return kind, wrap_section(bytes(section), len(records), compression=codec,
                              base_timestamp=now), codes


def _varint_at(data: bytes | bytearray, position: int) -> tuple[int, int]:
    """(zigzag varint value, its size in bytes) at `position`."""
    value = shift = size = 0
    while True:
        byte = data[position + size]
        value |= (byte & 0x7F) << shift
        size += 1
        shift += 7
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), size


def good_producer(address: str, topic: str, stop: threading.Event, report: dict) -> None:
    """A well-behaved confluent-kafka producer beside the fuzzer: every message delivered,
    none waiting long."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "linger.ms": 5, "acks": "all"})
    sent_at: dict[int, float] = {}
    worst = [0.0]
    errors: list = []

    def delivered(err, msg):
        if err is not None:
            errors.append(err)
            return
        worst[0] = max(worst[0], time.monotonic() - sent_at.pop(int(msg.value())))

    n = 0
    while not stop.is_set():
        sent_at[n] = time.monotonic()
        producer.produce(topic, value=str(n).encode(), partition=0, on_delivery=delivered)
        n += 1
        producer.poll(0.02)
    remaining = producer.flush(30)
    report.update(sent=n, undelivered=remaining + len(sent_at) if remaining else len(sent_at),
                  errors=errors, worst=worst[0])


def confluent_read_all(address: str, topic: str, expected: int, timeout: float = 30.0):
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": address, "group.id": "fuzz",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == -191, msg.error()  # _PARTITION_EOF
                if len(out) >= expected:
                    break
                continue
            out.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return out


@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(cases=st.lists(fuzz_cases(), min_size=25, max_size=40))
def test_fuzzed_produce_path(pg_url, store_url, cases):
    """Every acknowledged batch reads alike in kafka-python's and aiokafka's readers (as
    Kafka reads it) and back from the node in kcat and confluent-kafka; every refused one has the right code; the node stays up and a good
    producer beside the fuzzer never stalls. (A sync test with its own trio.run per
    example: pytest-trio's Hypothesis support would set the fixtures up per example.)"""
    kcat = require_tool("kcat")
    trio.run(_fuzz_one_node, pg_url, store_url, kcat, cases)


async def _fuzz_one_node(pg_url: str, store_url: str, kcat: str, cases) -> None:
    topic = f"fuzz-{time.monotonic_ns()}"
    stop, report = threading.Event(), {}
    async with trio.open_nursery() as nursery:
        node = await start_node(nursery, node_config(pg_url, store_url))
        producer_done = trio.Event()

        async def run_good_producer():
            try:
                await trio.to_thread.run_sync(good_producer, node, f"{topic}-good", stop, report)
            finally:
                producer_done.set()

        nursery.start_soon(run_good_producer)
        try:
            await _fuzz(node, kcat, topic, cases)
        finally:
            stop.set()
        with trio.fail_after(60):
            await producer_done.wait()
        assert report["sent"] > 0 and not report["errors"] and report["undelivered"] == 0, report
        assert report["worst"] < 10.0, report
        nursery.cancel_scope.cancel()


async def _fuzz(node: str, kcat: str, topic: str, cases) -> None:
    client = await KafkaClient.connect(node)
    expected: list[tuple[bytes | None, bytes | None]] = []
    for kind, batch, codes in cases:
        with trio.fail_after(30):
            result = await produce(client, topic, batch)
        code = int(result.error_code)
        assert code in codes, (kind, code, result.error_message, batch.hex())
        if code == 0:
            # Accepted: the independent reader must read it as it was sent.
            try:
                sent = read_alike(batch)
            except Exception as exc:  # noqa: BLE001
                pytest.fail(f"{kind}: acknowledged a batch the clients cannot read alike: "
                            f"{exc!r} {batch.hex()}")
            assert [o for o, _, _ in sent] == list(range(len(sent))), kind
            expected += [(k, v) for _, k, v in sent]
    if not expected:
        return
    stored = [r for b in await fetch_batches(client, topic) for r in kafka_python_read(b)]
    assert [(k, v) for _, k, v in stored] == expected
    await client.aclose()

    got = await trio.to_thread.run_sync(confluent_read_all, node, topic, len(expected))
    assert [(k, v) for _, k, v in got] == expected
    assert [o for o, _, _ in got] == list(range(len(expected)))
    with trio.fail_after(30):
        listed = await trio.run_process(
            [kcat, "-b", node, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q",
             "-f", "%o\\n"], capture_stdout=True, capture_stderr=True)
    assert listed.stdout.decode().split() == [str(i) for i in range(len(expected))]
    assert b"ERROR" not in listed.stderr.upper(), listed.stderr


# -- decompression bombs -------------------------------------------------------------------

MESSAGE_TOO_LARGE = 10


@pytest.mark.parametrize("kind", bombs.KINDS)
async def test_decompression_bomb_is_refused_and_the_node_serves_on(node, kind, caplog):
    # Built in a thread: compressing hundreds of MiB takes seconds, which on the trio thread
    # would stop the in-process node from renewing its membership.
    codec, payload, expanded = await trio.to_thread.run_sync(bombs.bomb, kind)
    bad = wrap_section(payload, 1, compression=codec)
    assert len(bad) < 1048588 and expanded > 3 * (64 << 20)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with caplog.at_level(logging.WARNING, logger="mink.broker.server.handlers.produce"):
        await refuse_then_serve(node, f"bomb-{kind}", bad, {MESSAGE_TOO_LARGE})
    # The node runs in this process: its peak memory grew by at most the 64 MiB limit's
    # buffer, never by the expanded size (without the guard the process aborts here).
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    assert growth < 96 << 20 < expanded // 2
    lines = [r for r in caplog.records if "refused as too large" in r.getMessage()]
    assert len(lines) == 1, lines


@pytest.mark.parametrize("codec", CODECS[1:], ids=codecs.CODEC_NAMES.get)
async def test_legit_batch_near_one_mib_compressed_is_accepted(node, codec):
    batch = await trio.to_thread.run_sync(bombs.legit_batch, codec, int(time.time() * 1000))
    client = await KafkaClient.connect(node)
    try:
        result = await produce(client, f"legit-{codecs.CODEC_NAMES[codec]}", batch)
        assert int(result.error_code) == 0, result
        [stored] = await fetch_batches(client, f"legit-{codecs.CODEC_NAMES[codec]}")
        assert len(kafka_python_read(stored)) == DefaultRecordBatch(batch).next_offset
    finally:
        await client.aclose()

"""RecordBatch v2: parsing, validation, patching, codecs, and cross-checks
against independent encoders/decoders (kafka-python, aiokafka)."""

from __future__ import annotations

import gzip
import os
import struct

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mink.protocol import compression as codecs
from mink.protocol.records import (
    LOG_APPEND_TIME,
    BatchError,
    BatchHeader,
    CorruptMessage,
    InvalidRecord,
    Record,
    UnsupportedCompressionType,
    UnsupportedMagic,
    build_batch,
    compute_crc,
    encode_records,
    is_crc_valid,
    iter_batches,
    iter_records,
    parse_batch_header,
    parse_batches,
    parse_produce_records,
    patch_batch,
    patched_batch,
    set_log_append_time,
    set_max_timestamp,
    write_crc,
)

ALL_CODECS = [codecs.NONE, codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD]
INT64 = st.integers(-(2**63), 2**63 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)

fuzz = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def record_lists(draw, *, text_header_keys: bool = False, max_records: int = 12) -> list[Record]:
    n = draw(st.integers(1, max_records))
    blobs = st.none() | st.binary(max_size=64)
    header_key = st.text(max_size=8)
    if not text_header_keys:  # also keys that are not UTF-8, as Java would decode them lossily
        header_key |= st.binary(max_size=8).map(lambda b: b.decode("utf-8", "surrogateescape"))
    records = []
    for i in range(n):
        headers = draw(st.lists(st.tuples(header_key, blobs), max_size=3))
        records.append(
            Record(
                offset_delta=i,
                timestamp_delta=draw(st.integers(-(2**40), 2**40)),
                key=draw(blobs),
                value=draw(blobs),
                headers=tuple(headers),
            )
        )
    return records


def compressible_records(n: int = 20) -> list[Record]:
    # Repetitive values, so every codec actually shrinks them (the kafka-python
    # and aiokafka builders fall back to no compression otherwise).
    return [Record(i, i * 3, b"key-%d" % i, b"value %d " % i * 40, (("h", b"v"),)) for i in range(n)]


def set_int(buf: bytearray, fmt: str, pos: int, value: int, *, fix_crc: bool = True) -> bytes:
    struct.pack_into(fmt, buf, pos, value)
    if fix_crc:
        write_crc(buf)
    return bytes(buf)


# -- round trips --------------------------------------------------------------


@fuzz
@given(
    records=record_lists(),
    codec=st.sampled_from(ALL_CODECS),
    producer_id=st.integers(0, 2**63 - 1) | st.just(-1),
    producer_epoch=st.integers(-1, 2**15 - 1),
    base_sequence=st.integers(0, 2**31 - 1),
    base_timestamp=st.integers(0, 2**42),
    leader_epoch=INT32,
    transactional=st.booleans(),
)
def test_build_parse_round_trip(
    records,
    codec,
    producer_id,
    producer_epoch,
    base_sequence,
    base_timestamp,
    leader_epoch,
    transactional,
):
    data = build_batch(
        records,
        compression=codec,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        base_timestamp=base_timestamp,
        partition_leader_epoch=leader_epoch,
        is_transactional=transactional,
    )
    [(header, view)] = parse_batches(data)
    assert bytes(view) == data and view.obj is data  # a view into the request, not a copy
    assert header.size == len(data)
    assert header.magic == 2
    assert header.compression == codec
    assert header.records_count == len(records)
    assert header.last_offset_delta == len(records) - 1
    assert header.last_offset == len(records) - 1
    assert header.base_timestamp == base_timestamp
    assert header.max_timestamp == base_timestamp + max(r.timestamp_delta for r in records)
    assert header.producer_id == producer_id and header.has_producer_id == (producer_id >= 0)
    assert header.producer_epoch == producer_epoch
    assert header.base_sequence == base_sequence
    assert header.partition_leader_epoch == leader_epoch
    assert header.is_transactional == transactional
    assert not header.is_control and header.timestamp_type == 0
    assert header.crc == compute_crc(data)
    assert parse_batch_header(data) == header
    assert list(iter_records(view)) == records
    timestamps = [header.record_timestamp(r) for r in records]
    assert timestamps == [base_timestamp + r.timestamp_delta for r in records]


@fuzz
@given(
    batches=st.lists(
        st.tuples(record_lists(max_records=4), st.sampled_from(ALL_CODECS)), min_size=1, max_size=4
    )
)
def test_concatenated_batches_are_all_returned(batches):
    built = [build_batch(recs, compression=codec, base_timestamp=0) for recs, codec in batches]
    parsed = parse_batches(b"".join(built))
    assert [bytes(view) for _, view in parsed] == built
    assert [list(iter_records(view)) for _, view in parsed] == [recs for recs, _ in batches]
    assert [bytes(v) for _, v in iter_batches(b"".join(built))] == built


def test_empty_records_field_has_no_batches():
    assert parse_batches(b"") == []
    assert list(iter_batches(b"")) == []


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_extreme_varints_round_trip(codec):
    records = [
        Record(0, -(2**63) + 1, None, b"", ()),
        Record(1, 2**63 - 2**42, b"", None, (("", None), ("k\u00e9y", b""))),
        Record(2, 0, b"x" * 300, b"y" * 70000, ()),
    ]
    data = build_batch(records, compression=codec, base_timestamp=0, max_timestamp=0)
    [(_, view)] = parse_batches(data)
    assert list(iter_records(view)) == records


def test_last_sequence_wraps_like_kafka():
    def header(base_sequence: int, delta: int) -> BatchHeader:
        return BatchHeader(0, 49, 0, 2, 0, 0, delta, 0, 0, 1, 0, base_sequence, delta + 1)

    assert header(5, 3).last_sequence == 8
    assert header(2**31 - 1, 0).last_sequence == 2**31 - 1
    assert header(2**31 - 2, 3).last_sequence == 1  # ..., 2**31-1, 0, 1
    assert header(2**31 - 1, 1).last_sequence == 0
    assert header(-1, 7).last_sequence == -1


# -- corruption and malformed input --------------------------------------------


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_every_byte_flip_is_detected(codec):
    data = build_batch(compressible_records(3), compression=codec, base_timestamp=1)
    for pos in range(len(data)):
        corrupt = bytearray(data)
        corrupt[pos] ^= 0x5A
        if 12 <= pos < 16:  # partitionLeaderEpoch: outside the CRC, free to change
            parse_batches(corrupt)
            continue
        with pytest.raises(BatchError) as info:
            parse_batches(corrupt)
        expected = {range(0, 8): InvalidRecord, range(16, 17): UnsupportedMagic}
        kind = next((exc for span, exc in expected.items() if pos in span), CorruptMessage)
        assert type(info.value) is kind, pos
        assert info.value.error_code == (87 if kind is InvalidRecord else 2)


@fuzz
@given(records=record_lists(), codec=st.sampled_from(ALL_CODECS), data=st.data())
def test_crc_covered_corruption_is_corrupt_message(records, codec, data):
    batch = bytearray(build_batch(records, compression=codec, base_timestamp=0))
    pos = data.draw(st.integers(17, len(batch) - 1))
    batch[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptMessage):
        parse_batches(batch)


@pytest.mark.parametrize("codec", [codecs.NONE, codecs.GZIP])
def test_truncation_at_every_cut_point(codec):
    one = build_batch(compressible_records(4), compression=codec, base_timestamp=0)
    two = one + one
    for cut in range(1, len(two)):
        if cut == len(one):
            assert len(parse_batches(two[:cut])) == 1
            continue
        with pytest.raises(CorruptMessage):
            parse_batches(two[:cut])
        with pytest.raises(CorruptMessage):
            parse_produce_records(two[:cut], 9)
        with pytest.raises(CorruptMessage):
            list(iter_batches(two[:cut]))


@pytest.mark.parametrize("batch_length", [-(2**31), -1, 0, 13, 48, 2**31 - 1])
def test_bad_batch_length_rejected(batch_length):
    data = bytearray(build_batch(compressible_records(2), base_timestamp=0))
    set_int(data, ">i", 8, batch_length, fix_crc=False)
    with pytest.raises(CorruptMessage):
        parse_batches(data)


def test_oversized_batch_length_rejected():
    data = bytearray(build_batch(compressible_records(2), base_timestamp=0))
    for extra in (1, 2, 1000):
        struct.pack_into(">i", data, 8, len(data) - 12 + extra)
        with pytest.raises(CorruptMessage, match="truncated"):
            parse_batches(data)


def test_trailing_garbage_rejected():
    data = build_batch(compressible_records(2), base_timestamp=0)
    for tail in (b"\x00", b"\x00" * 11, b"\x00" * 12, b"\x00" * 61, data[:61]):
        with pytest.raises(CorruptMessage):
            parse_batches(data + tail)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_batch_error(data):
    try:
        parse_batches(data)
    except BatchError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=61, max_size=300), st.integers(0, 7))
def test_iter_records_on_random_bytes_only_raises_batch_error(data, codec):
    batch = bytearray(data)
    batch[16] = 2
    struct.pack_into(">h", batch, 21, codec)
    try:
        list(iter_records(batch))
    except BatchError:
        pass


@fuzz
@given(data=st.data(), codec=st.sampled_from(ALL_CODECS))
def test_random_header_fields_only_raise_batch_error(data, codec):
    # A real batch with random header fields (CRC made valid): reaches past the
    # CRC check into the count/flag checks and the record decoder.
    batch = bytearray(build_batch(compressible_records(3), compression=codec, base_timestamp=0))
    for fmt, pos in ((">h", 21), (">i", 23), (">q", 43), (">i", 53), (">i", 57)):
        if data.draw(st.booleans()):
            bits = struct.calcsize(fmt) * 8
            value = data.draw(st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1))
            struct.pack_into(fmt, batch, pos, value)
    write_crc(batch)
    try:
        for _, view in parse_batches(batch):
            list(iter_records(view))
    except BatchError:
        pass


@fuzz
@given(records=record_lists(max_records=5), codec=st.sampled_from(ALL_CODECS), data=st.data())
def test_mangled_record_payload_only_raises_batch_error(records, codec, data):
    # Corrupt the records section itself (uncompressed, then re-compressed, or
    # the compressed bytes directly) with a valid CRC: the decoder must refuse
    # cleanly, never crash.
    batch = bytearray(build_batch(records, compression=codec, base_timestamp=0))
    payload = bytearray(batch[61:])
    if payload:
        pos = data.draw(st.integers(0, len(payload) - 1))
        payload[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    batch[61:] = payload[:cut]
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    write_crc(batch)
    try:
        [(_, view)] = parse_batches(batch)
        list(iter_records(view))
    except BatchError:
        pass


# -- Kafka's batch rules -------------------------------------------------------


def test_base_offset_must_be_zero():
    data = bytearray(build_batch(compressible_records(2), base_timestamp=0))
    with pytest.raises(InvalidRecord, match="baseOffset"):
        parse_batches(set_int(data, ">q", 0, 7, fix_crc=False))


@pytest.mark.parametrize(
    ("last_offset_delta", "records_count"),
    [(0, 2), (2, 2), (-1, 0), (-1, 2), (1, 0), (2**31 - 1, -(2**31))],
)
def test_count_must_match_offset_range(last_offset_delta, records_count):
    data = bytearray(build_batch(compressible_records(2), base_timestamp=0))
    struct.pack_into(">i", data, 23, last_offset_delta)
    struct.pack_into(">i", data, 57, records_count)
    write_crc(data)
    with pytest.raises(InvalidRecord):
        parse_batches(data)


def test_control_batches_from_clients_rejected():
    data = build_batch(
        [Record(0, 0, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x05")],
        is_control=True,
        is_transactional=True,
        producer_id=1,
        producer_epoch=0,
        base_sequence=0,
    )
    assert parse_batch_header(data).is_control
    assert list(iter_batches(data))  # stored control batches are fine
    with pytest.raises(InvalidRecord, match="control"):
        parse_batches(data)


def test_idempotent_batch_needs_a_sequence():
    def idempotent(base_sequence: int) -> bytes:
        return build_batch(
            compressible_records(1), producer_id=4, producer_epoch=0, base_sequence=base_sequence
        )

    with pytest.raises(InvalidRecord, match="sequence"):
        parse_batches(idempotent(-1))
    parse_batches(idempotent(0))


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec_rejected(codec):
    data = bytearray(build_batch(compressible_records(1), base_timestamp=0))
    with pytest.raises(InvalidRecord, match="codec"):
        parse_batches(set_int(data, ">h", 21, codec))
    with pytest.raises(InvalidRecord):
        list(iter_records(bytes(data)))


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_message_sets_rejected(magic):
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
    builder.append(0, 1000 if magic else None, b"k", b"v")
    with pytest.raises(UnsupportedMagic) as info:
        parse_batches(bytes(builder.build()))
    assert info.value.error_code == 2


def test_future_magic_rejected():
    data = bytearray(build_batch(compressible_records(1)))
    data[16] = 3
    with pytest.raises(UnsupportedMagic):
        parse_batches(data)
    with pytest.raises(UnsupportedMagic):
        parse_batch_header(data)


def test_produce_records_exactly_one_batch():
    one = build_batch(compressible_records(2), base_timestamp=0)
    header, view = parse_produce_records(one, 3)
    assert bytes(view) == one and header.records_count == 2
    with pytest.raises(InvalidRecord, match="at least one"):
        parse_produce_records(b"", 9)
    with pytest.raises(InvalidRecord, match="exactly one"):
        parse_produce_records(one + one, 9)
    # Kafka counts batches before looking at CRCs.
    corrupt = bytearray(one)
    corrupt[-1] ^= 1
    with pytest.raises(InvalidRecord, match="exactly one"):
        parse_produce_records(one + bytes(corrupt), 9)
    with pytest.raises(CorruptMessage):
        parse_produce_records(bytes(corrupt), 9)


def test_zstd_needs_produce_v7():
    data = build_batch(compressible_records(2), compression=codecs.ZSTD)
    with pytest.raises(UnsupportedCompressionType) as info:
        parse_produce_records(data, 6)
    assert info.value.error_code == 76
    parse_produce_records(data, 7)


# -- patching ------------------------------------------------------------------


@fuzz
@given(
    records=record_lists(max_records=4),
    codec=st.sampled_from(ALL_CODECS),
    base_offset=INT64,
    leader_epoch=INT32,
    prefix=st.binary(max_size=20),
)
def test_patch_offsets_keeps_crc(records, codec, base_offset, leader_epoch, prefix):
    original = build_batch(records, compression=codec, base_timestamp=0)
    buf = bytearray(prefix + original + b"tail")
    patch_batch(buf, len(prefix), base_offset, leader_epoch)
    patched = bytes(buf[len(prefix) : len(prefix) + len(original)])
    assert buf[: len(prefix)] == prefix and buf.endswith(b"tail")
    changed = {i for i in range(len(original)) if patched[i] != original[i]}
    assert changed <= set(range(0, 8)) | set(range(12, 16))
    header = parse_batch_header(patched)
    assert header.base_offset == base_offset
    assert header.partition_leader_epoch == leader_epoch
    assert header.last_offset == base_offset + len(records) - 1
    assert header._replace(base_offset=0, partition_leader_epoch=-1) == parse_batch_header(original)
    assert is_crc_valid(patched) and is_crc_valid(buf, len(prefix))
    assert patched_batch(memoryview(original), base_offset, leader_epoch) == patched
    offsets = [header.record_offset(r) for r in iter_records(patched)]
    assert offsets == [base_offset + i for i in range(len(records))]


@fuzz
@given(
    records=record_lists(max_records=4),
    codec=st.sampled_from(ALL_CODECS),
    now=st.integers(0, 2**45),
    transactional=st.booleans(),
)
def test_log_append_time(records, codec, now, transactional):
    original = build_batch(
        records,
        compression=codec,
        base_timestamp=1234,
        producer_id=9 if transactional else -1,
        producer_epoch=0,
        base_sequence=0 if transactional else -1,
        is_transactional=transactional,
    )
    before = parse_batch_header(original)
    buf = bytearray(b"xx" + original)
    assert set_log_append_time(buf, 2, now) is True
    assert not set_log_append_time(buf, 2, now)  # already so: untouched, as Kafka's setMaxTimestamp
    patched = bytes(buf[2:])
    [(header, _)] = parse_batches(patched)  # CRC valid again
    assert header.timestamp_type == LOG_APPEND_TIME
    assert header.max_timestamp == now
    assert header.attributes == before.attributes | 0x08
    restored = header._replace(
        attributes=before.attributes, max_timestamp=before.max_timestamp, crc=before.crc
    )
    assert restored == before
    assert list(iter_records(patched)) == records  # records keep their deltas
    assert all(header.record_timestamp(r) == now for r in records)
    # and back, the way Kafka rewrites a batch for a CreateTime topic
    assert set_max_timestamp(buf, 2, 0, before.max_timestamp)
    assert bytes(buf[2:]) == original


def test_set_max_timestamp_drops_unknown_attribute_bits():
    data = bytearray(build_batch(compressible_records(1), compression=codecs.LZ4, base_timestamp=0))
    set_int(data, ">h", 21, 0x7F00 | 0x40 | codecs.LZ4)
    set_log_append_time(data, 0, 99)
    assert parse_batch_header(data).attributes == 0x40 | 0x08 | codecs.LZ4
    assert is_crc_valid(data)


# -- codecs ----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(payload=st.binary(max_size=5000) | st.binary(min_size=1, max_size=50).map(lambda b: b * 2000))
def test_codec_round_trips(payload):
    for codec in ALL_CODECS:
        assert codecs.decompress(codec, codecs.compress(codec, payload)) == payload


def test_snappy_framings():
    payload = os.urandom(5000) + b"abc" * 40000  # > 32 KiB: several xerial blocks
    xerial = codecs.compress(codecs.SNAPPY, payload)
    assert xerial.startswith(b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01")
    assert codecs.decompress(codecs.SNAPPY, xerial) == payload
    # librdkafka sends raw snappy
    assert codecs.decompress(codecs.SNAPPY, bytes(cramjam.snappy.compress_raw(payload))) == payload
    # some producers write the xerial version fields little-endian; snappy-java reads them anyway
    le = xerial[:8] + struct.pack("<ii", 1, 1) + xerial[16:]
    assert codecs.decompress(codecs.SNAPPY, le) == payload
    # an xerial stream without blocks is empty data
    assert codecs.decompress(codecs.SNAPPY, xerial[:16]) == b""
    with pytest.raises(ValueError):
        codecs.decompress(codecs.SNAPPY, xerial[:16] + struct.pack(">i", 10**6) + b"x")


def test_gzip_concatenated_members_and_foreign_frames():
    import lz4.frame
    import zstandard

    payload = b"hello kafka " * 1000
    members = gzip.compress(payload[:7]) + gzip.compress(payload[7:])
    assert codecs.decompress(codecs.GZIP, members) == payload
    # LZ4 frames with the options the Java and librdkafka producers may use
    for block_checksum in (False, True):
        for content_checksum in (False, True):
            frame = lz4.frame.compress(
                payload,
                block_checksum=block_checksum,
                content_checksum=content_checksum,
                block_linked=False,
            )
            assert codecs.decompress(codecs.LZ4, frame) == payload
    # zstd streaming frames carry no content size
    stream = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    assert codecs.decompress(codecs.ZSTD, stream.compress(payload) + stream.flush()) == payload


@pytest.mark.parametrize("codec", ALL_CODECS[1:])
def test_undecompressable_payload_is_corrupt_message(codec):
    records = encode_records(compressible_records(2))
    data = bytearray(build_batch(compressible_records(2), base_timestamp=0))
    data[61:] = b"\x00garbage" + records  # not a valid stream for any codec
    set_int(data, ">h", 21, codec, fix_crc=False)
    struct.pack_into(">i", data, 8, len(data) - 12)
    write_crc(data)
    parse_batches(data)  # the header is fine; only decoding finds out
    with pytest.raises(CorruptMessage):
        list(iter_records(data))


# -- independent implementations ---------------------------------------------------


def _kafka_python_batch(codec: int, records: list[Record], base_timestamp: int, **producer) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=producer.get("is_transactional", False),
        producer_id=producer.get("producer_id", -1),
        producer_epoch=producer.get("producer_epoch", -1),
        base_sequence=producer.get("base_sequence", -1),
        batch_size=1 << 24,
    )
    for r in records:
        timestamp = base_timestamp + r.timestamp_delta
        builder.append(r.offset_delta, timestamp, r.key, r.value, list(r.headers))
    return bytes(builder.build())


def _aiokafka_batch(codec: int, records: list[Record], base_timestamp: int) -> bytes:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 24)
    for r in records:
        timestamp = base_timestamp + r.timestamp_delta
        builder.append(r.offset_delta, timestamp, r.key, r.value, list(r.headers))
    return bytes(builder.build())


def _kafka_python_can(codec: int) -> bool:
    import kafka.codec

    return {
        codecs.NONE: True,
        codecs.GZIP: kafka.codec.has_gzip(),
        codecs.SNAPPY: kafka.codec.has_snappy(),
        codecs.LZ4: kafka.codec.has_lz4(),
        codecs.ZSTD: kafka.codec.has_zstd(),
    }[codec]


@pytest.mark.parametrize("codec", ALL_CODECS)
@pytest.mark.parametrize("library", ["kafka-python", "aiokafka"])
def test_parse_batches_from_client_libraries(codec, library):
    if library == "kafka-python" and not _kafka_python_can(codec):
        pytest.skip(f"kafka-python cannot build {codecs.CODEC_NAMES[codec]} here")
    records = compressible_records(25)
    build = _kafka_python_batch if library == "kafka-python" else _aiokafka_batch
    data = build(codec, records, 1_700_000_000_000)
    header, view = parse_produce_records(data, 9)
    assert header.compression == codec  # the payload did shrink, so the codec was used
    assert header.base_timestamp == 1_700_000_000_000
    assert header.max_timestamp == 1_700_000_000_000 + records[-1].timestamp_delta
    assert header.records_count == len(records)
    if codec == codecs.SNAPPY:
        assert bytes(view[61:69]) == b"\x82SNAPPY\x00"  # xerial framing, as the Java client writes
    assert list(iter_records(view)) == records


def test_parse_idempotent_batch_from_kafka_python():
    records = compressible_records(3)
    data = _kafka_python_batch(
        codecs.GZIP,
        records,
        0,
        producer_id=77,
        producer_epoch=2,
        base_sequence=2**31 - 2,
        is_transactional=True,
    )
    [(header, _)] = parse_batches(data)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 2, 2**31 - 2)
    assert header.is_transactional and header.has_producer_id
    assert header.last_sequence == 0


@settings(max_examples=80, deadline=None)
@given(
    records=record_lists(text_header_keys=True),
    codec=st.sampled_from(ALL_CODECS),
    base_timestamp=st.integers(0, 2**42),
)
def test_client_libraries_read_what_we_build(records, codec, base_timestamp):
    from aiokafka.record.default_records import DefaultRecordBatch as AioBatch
    from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch

    data = build_batch(records, compression=codec, base_timestamp=base_timestamp)
    patched = bytearray(data)
    patch_batch(patched, 0, 1000, 3)
    readers = [AioBatch] + ([KafkaPythonBatch] if _kafka_python_can(codec) else [])
    for reader in readers:
        batch = reader(bytes(patched))
        assert batch.validate_crc()
        got = [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch]
        expected = [
            (1000 + r.offset_delta, base_timestamp + r.timestamp_delta, r.key, r.value, r.headers)
            for r in records
        ]
        assert got == expected, reader
    # ...and see LogAppendTime the way we set it
    set_log_append_time(patched, 0, 42)
    for reader in readers:
        batch = reader(bytes(patched))
        assert batch.validate_crc() and batch.timestamp_type == 1
        assert {r.timestamp for r in batch} == {42}

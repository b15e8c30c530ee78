"""Kafka's LogValidator rules (mink/protocol/log_validator.py) on plain bytes, and the
compiled record walk giving exactly the pure-Python walk's results."""

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mink.protocol import compression as codecs
from mink.protocol import log_validator, record_walk
from mink.protocol.log_validator import (
    Refusal,
    ValidationSettings,
    ValidBatch,
    validate_produce_records,
)
from mink.protocol.records import (
    LOG_APPEND_TIME,
    Record,
    encode_records,
    is_crc_valid,
    iter_records,
    parse_batch_header,
)
from tests.support.batches import records_batch, values, wrap_section

NOW = 1_700_000_000_000
SETTINGS = ValidationSettings(now_ms=NOW)
CODECS = [codecs.NONE, codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD]


def validate(batch: bytes, settings: ValidationSettings = SETTINGS, version: int = 9):
    return validate_produce_records(batch, version, settings)


def refused(batch: bytes, code: int, settings: ValidationSettings = SETTINGS) -> Refusal:
    result = validate(batch, settings)
    assert isinstance(result, Refusal), result
    assert result.error_code == code, result
    return result


@pytest.mark.parametrize("codec", CODECS)
def test_valid_batch_passes_with_its_computed_max_timestamp(codec):
    records = [Record(i, delta, b"k", b"v" * 100, (("h", b"x"),)) for i, delta in
               enumerate([5, 90, 3])]
    # The client's maxTimestamp is a lie (too small): the computed one replaces it.
    batch = records_batch(records, compression=codec, base_timestamp=NOW, max_timestamp=NOW)
    result = validate(batch)
    assert isinstance(result, ValidBatch)
    assert result.max_timestamp == NOW + 90
    assert parse_batch_header(result.batch).max_timestamp == NOW + 90
    assert is_crc_valid(result.batch)
    assert [r.value for r in iter_records(result.batch)] == [b"v" * 100] * 3


def test_a_correct_max_timestamp_leaves_the_batch_as_sent():
    batch = records_batch(values(3), base_timestamp=NOW, max_timestamp=NOW + 2)
    result = validate(batch)
    assert bytes(result.batch) == batch and result.max_timestamp == NOW + 2


def test_log_append_time_topic_stamps_now():
    batch = records_batch(values(2), base_timestamp=NOW - 5000)
    result = validate(batch, SETTINGS._replace(timestamp_type=LOG_APPEND_TIME))
    header = parse_batch_header(result.batch)
    assert result.max_timestamp == NOW == header.max_timestamp == result.log_append_time
    assert header.timestamp_type == LOG_APPEND_TIME and is_crc_valid(result.batch)


# -- the fuzzer's cases: valid CRC, bad records -------------------------------------


def test_valid_crc_over_garbage_records_is_invalid_record():
    refused(wrap_section(b"\xff\x13garbage that is no record" * 3, 2), 87)


@pytest.mark.parametrize("codec", CODECS[1:])
def test_garbage_compressed_payload_is_corrupt_message(codec):
    refused(wrap_section(b"\x00\x01 not compressed at all " * 5, 1, compression=codec), 2)


@pytest.mark.parametrize("codec", CODECS[1:])
def test_compressed_garbage_records_are_invalid_record(codec):
    section = codecs.compress(codec, b"\x09garbage, well compressed")
    refused(wrap_section(section, 1, compression=codec), 87)


def test_wrong_last_offset_delta_is_invalid_record_with_record_errors():
    records = [Record(0, 0, None, b"a"), Record(1, 0, None, b"b"), Record(7, 0, None, b"c")]
    result = refused(records_batch(records, last_offset_delta=2), 87)
    assert [e.batch_index for e in result.record_errors] == [2]
    assert "offsetDelta 7" in result.record_errors[0].message


@pytest.mark.parametrize("count", [1, 2, 4, 50])
def test_wrong_record_count_is_invalid_record(count):
    # Three records in the section, `count` in a header consistent with itself.
    section = encode_records(values(3))
    refused(wrap_section(section, count), 87)


@pytest.mark.parametrize("mangle", ["size_past_end", "size_short", "key_past_end",
                                    "key_length_below_minus_one", "negative_header_count",
                                    "header_key_past_end", "long_varint"])
def test_bad_lengths_are_invalid_record(mangle):
    body = bytearray()
    body.append(0)           # attributes
    body += b"\x00"          # timestampDelta 0
    body += b"\x00"          # offsetDelta 0
    body += b"\x02k"         # key: length 1
    body += b"\x02v"         # value: length 1
    body += b"\x00"          # no headers
    if mangle == "key_past_end":
        body[3] = 0x7E       # key length 63
    elif mangle == "key_length_below_minus_one":
        body[3:5] = b"\x09"  # -5
    elif mangle == "negative_header_count":
        body[-1] = 0x01      # -1
    elif mangle == "header_key_past_end":
        body[-1] = 0x02      # one header, then nothing
        body += b"\x40"
    elif mangle == "long_varint":
        body[1:2] = b"\xff" * 11
    size = len(body)
    if mangle == "size_past_end":
        size += 40
    elif mangle == "size_short":
        size -= 2
    section = bytes([size << 1]) + bytes(body)
    result = refused(wrap_section(section, 1), 87)
    assert result.record_errors == ()


def test_count_of_a_million_over_a_few_bytes_fails_fast():
    refused(wrap_section(encode_records(values(1)), 1_000_000), 87)


# -- timestamps ----------------------------------------------------------------------


def test_record_timestamps_are_checked_each():
    records = [Record(0, 0, None, b"a"), Record(1, 10_000, None, b"b"), Record(2, 1, None, b"c")]
    batch = records_batch(records, base_timestamp=NOW, max_timestamp=NOW + 1)
    result = refused(batch, 32, SETTINGS._replace(timestamp_after_max_ms=5000))
    assert [e.batch_index for e in result.record_errors] == [1]
    # within bounds: accepted, and the max comes from record 1, not the header's NOW + 1
    ok = validate(batch, SETTINGS._replace(timestamp_after_max_ms=20_000))
    assert ok.max_timestamp == NOW + 10_000


def test_client_log_append_time_batch_on_log_append_time_topic_is_invalid_timestamp():
    batch = records_batch(values(2), attributes=0x08)
    result = refused(batch, 32, SETTINGS._replace(timestamp_type=LOG_APPEND_TIME))
    assert [e.batch_index for e in result.record_errors] == [0, 1]


# -- flags ---------------------------------------------------------------------------


def test_transactional_batch_without_transactional_id_is_refused():
    refused(records_batch(values(1), attributes=0x10, producer_id=1, producer_epoch=0,
                          base_sequence=0), 53)


def test_producer_id_needs_an_epoch():
    refused(records_batch(values(1), producer_id=1, producer_epoch=-1, base_sequence=0), 87)


def test_header_rules_still_apply():
    refused(records_batch(values(2), base_offset=5), 87)
    batch = bytearray(records_batch(values(2)))
    batch[-1] ^= 1
    refused(bytes(batch), 2)  # CRC
    refused(records_batch(values(2), attributes=0x20), 87)  # control batch


def test_max_message_bytes_is_checked_before_decompressing():
    batch = records_batch(values(10, 200), compression=codecs.GZIP)
    refused(batch, 10, SETTINGS._replace(max_message_bytes=len(batch) - 1))


def test_validation_off_trusts_the_records():
    garbage = wrap_section(b"\xff" * 20, 1)
    result = validate(garbage, SETTINGS._replace(validate_records=False))
    assert isinstance(result, ValidBatch)


# -- the compiled walk is the pure walk ------------------------------------------------


def test_compiled_walk_is_built_in_ci():
    if os.environ.get("MINK_REQUIRE_TOOLS"):
        assert log_validator.COMPILED, "the compiled record walk was not built"
    if not log_validator.COMPILED:
        pytest.skip("the compiled record walk is not built (pure-Python fallback in use)")


def _both(data: bytes, count: int, base: int, low: int, high: int, check: bool, key: bool):
    pure = record_walk.walk_records(data, count, base, low, high, check, key)
    if log_validator.COMPILED:
        compiled = log_validator.walk_records(data, count, base, low, high, check, key)
        assert compiled == pure
        compiled_view = log_validator.walk_records(memoryview(data), count, base, low, high,
                                                   check, key)
        assert compiled_view == pure
    return pure


_walk_args = dict(
    base=st.integers(-(2**63), 2**63 - 1) | st.integers(-5, 5),
    low=st.integers(-(2**63), 2**63 - 1),
    high=st.integers(-(2**63), 2**63 - 1),
    check=st.booleans(), key=st.booleans())


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=200), count=st.integers(0, 30), **_walk_args)
def test_walks_agree_on_random_bytes(data, count, base, low, high, check, key):
    _both(data, count, base, low, high, check, key)


@st.composite
def mangled_sections(draw):
    records = draw(st.lists(st.builds(
        Record, st.integers(0, 3), st.integers(-(2**63), 2**63 - 1),
        st.none() | st.binary(max_size=8), st.none() | st.binary(max_size=8),
        st.lists(st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=4)),
                 max_size=3)), min_size=1, max_size=6))
    records = [r._replace(offset_delta=i if draw(st.booleans()) else r.offset_delta)
               for i, r in enumerate(records)]
    section = bytearray(encode_records(records))
    for _ in range(draw(st.integers(0, 3))):
        if section:
            section[draw(st.integers(0, len(section) - 1))] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(section)))
    return bytes(section[:cut] if draw(st.booleans()) else section), len(records)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(case=mangled_sections(), extra=st.integers(-1, 1), **_walk_args)
def test_walks_agree_on_mangled_records(case, extra, base, low, high, check, key):
    section, count = case
    _both(section, max(0, count + extra), base, low, high, check, key)


@settings(max_examples=200)
@given(st.lists(st.builds(Record, st.just(0), st.integers(-(2**40), 2**40),
                          st.none() | st.binary(max_size=20), st.binary(max_size=20),
                          st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)),
                                   max_size=2)), min_size=1, max_size=8))
def test_walk_reads_what_encode_records_writes(records):
    records = [r._replace(offset_delta=i) for i, r in enumerate(records)]
    base = NOW
    error, max_timestamp, found = _both(encode_records(records), len(records), base,
                                        -(2**63), 2**63 - 1, True, False)
    assert error is None and found == []
    assert max_timestamp == max(max(base + r.timestamp_delta for r in records), -1)


def test_varints_wrap_as_java_reads_them():
    # A 5-byte varint whose value needs more than 32 bits: Java keeps the low 32 bits.
    data = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x7F])
    assert record_walk._varint(data, 0, 5) == (-(2**31), 5)
    # Timestamps add in 64-bit two's complement, as Java longs do.
    record = encode_records([Record(0, 10, None, b"x")])
    wrapped = -(2**63) + 5
    assert _both(record, 1, 2**63 - 5, wrapped, wrapped, True, False) == (None, -1, [])
    assert _both(record, 1, 2**63 - 5, 0, 2**63 - 1, True, False) == (
        None, -1, [(0, record_walk.TIMESTAMP, wrapped)])


def test_header_keys_must_be_utf8():
    # Kafka decodes them with replacement characters; kafka-python's consumer fails on them.
    body = b"\x00\x00\x00\x01\x02v\x02\x02\xff\x01"  # one header, key b"\xff", value null
    section = bytes([len(body) << 1]) + body
    assert "not UTF-8" in _both(section, 1, NOW, 0, 0, False, False)[0]
    ok = encode_records([Record(0, 0, None, b"v", (("clé", b"x"),))])
    assert _both(ok, 1, NOW, -(2**63), 2**63 - 1, True, False) == (None, NOW, [])


@pytest.mark.parametrize("codec", CODECS)
def test_validator_gives_the_same_answers_on_the_pure_python_walk(monkeypatch, codec):
    records = [Record(0, 0, None, b"a"), Record(1, 50, b"k", b"b"), Record(5, 1, None, b"c")]
    cases = [records_batch(records[:2], compression=codec, base_timestamp=NOW),
             records_batch(records, compression=codec, base_timestamp=NOW, last_offset_delta=2),
             wrap_section(codecs.compress(codec, b"\x07garbage"), 1, compression=codec)]
    compiled = [validate(b) for b in cases]
    monkeypatch.setattr(log_validator, "walk_records", record_walk.walk_records)
    assert [validate(b) for b in cases] == compiled
    assert isinstance(compiled[0], ValidBatch) and compiled[0].max_timestamp == NOW + 50

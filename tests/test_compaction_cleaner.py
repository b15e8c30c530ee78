"""The LogCleaner's pure part (mink/storage/compaction/cleaner.py): latest record per key
kept at its offset, batches rebuilt in their own codec and readable by the clients'
readers, KIP-534 tombstone horizon, markers and transactional batches left alone."""

from __future__ import annotations

import pytest

from mink.protocol import compression as codecs
from mink.protocol.records import (
    Record,
    build_batch,
    iter_records,
    parse_batch_header,
)
from mink.storage.compaction.cleaner import (
    build_offset_map,
    clean_batch,
    clean_batches,
)
from tests.support import readers

NOW = 1_700_000_000_000
DAY = 86_400_000


def batch(base: int, items: list[tuple[bytes | None, bytes | None]], *, codec=codecs.NONE,
          ts: int = NOW - 10_000, **kw) -> bytes:
    return build_batch([Record(i, i, k, v) for i, (k, v) in enumerate(items)],
                       base_offset=base, compression=codec, base_timestamp=ts, **kw)


def contents(batches) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    for b in batches:
        header = parse_batch_header(b)
        out += [(header.base_offset + r.offset_delta, r.key, r.value) for r in iter_records(b)]
    return out


@pytest.mark.parametrize("codec", [codecs.NONE, codecs.GZIP, codecs.SNAPPY, codecs.LZ4,
                                   codecs.ZSTD])
def test_latest_per_key_kept_at_its_offset_in_the_batch_codec(codec):
    log = [batch(0, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2")], codec=codec),
           batch(3, [(b"c", b"1"), (b"b", b"2")], codec=codec),
           batch(5, [(b"d", b"1")], codec=codec)]
    offset_map = build_offset_map(log, 0, 6)
    result = clean_batches(log, offset_map, now_ms=NOW, delete_retention_ms=DAY, end=6)
    assert contents(result.batches) == [(2, b"a", b"2"), (3, b"c", b"1"), (4, b"b", b"2"),
                                        (5, b"d", b"1")]
    assert (result.records_in, result.records_out) == (6, 4)
    first = parse_batch_header(result.batches[0])
    # same range, same codec, the clients read it
    assert (first.base_offset, first.last_offset, first.compression) == (0, 2, codec)
    assert first.records_count == 1
    for b in result.batches:
        header = parse_batch_header(b)
        as_kafka = [(header.base_offset + r.offset_delta, r.key, r.value, list(r.headers))
                    for r in iter_records(b)]
        assert readers.kafka_python_records(bytes(b)) == as_kafka
        assert readers.aiokafka_records(bytes(b)) == as_kafka
    assert bytes(result.batches[2]) == log[2]  # untouched batches are kept byte for byte


def test_record_timestamps_and_producer_fields_survive_a_rebuild():
    original = batch(10, [(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], producer_id=7,
                     producer_epoch=1, base_sequence=30, partition_leader_epoch=4)
    later = batch(13, [(b"b", b"2")])
    offset_map = build_offset_map([original, later], 10, 14)
    cleaned = clean_batch(original, offset_map, now_ms=NOW, delete_retention_ms=DAY, end=14)
    header = parse_batch_header(cleaned.batch)
    assert (header.producer_id, header.producer_epoch, header.base_sequence,
            header.partition_leader_epoch, header.last_offset) == (7, 1, 30, 4, 12)
    assert [(header.base_offset + r.offset_delta, header.base_timestamp + r.timestamp_delta)
            for r in iter_records(cleaned.batch)] == [(10, NOW - 10_000), (12, NOW - 9_998)]


def test_a_batch_losing_every_record_goes_but_the_last_batch_stays():
    log = [batch(0, [(b"a", b"1")]), batch(1, [(b"a", b"2")])]
    result = clean_batches(log, build_offset_map(log, 0, 2), now_ms=NOW,
                           delete_retention_ms=DAY, end=2)
    assert contents(result.batches) == [(1, b"a", b"2")]


def test_tombstones_get_a_horizon_then_go_after_it():
    log = [batch(0, [(b"a", b"1"), (b"b", b"1")]), batch(2, [(b"a", None)]),
           batch(3, [(b"c", b"1")])]
    first = clean_batches(log, build_offset_map(log, 0, 4), now_ms=NOW,
                          delete_retention_ms=1000, end=4)
    assert contents(first.batches) == [(1, b"b", b"1"), (2, b"a", None), (3, b"c", b"1")]
    tombstone = parse_batch_header(first.batches[1])
    assert tombstone.has_delete_horizon_ms and tombstone.base_timestamp == NOW + 1000
    # the record's own timestamp is unchanged (its delta is taken against the horizon)
    (record,) = iter_records(first.batches[1])
    assert tombstone.base_timestamp + record.timestamp_delta == NOW - 10_000
    # a second pass before the horizon keeps it, unchanged
    again = clean_batches(first.batches, build_offset_map(first.batches, 4, 4), now_ms=NOW + 999,
                          delete_retention_ms=1000, end=4)
    assert contents(again.batches) == contents(first.batches)
    assert bytes(again.batches[1]) == bytes(first.batches[1])
    # after the horizon it goes
    late = clean_batches(first.batches, build_offset_map(first.batches, 4, 4),
                         now_ms=NOW + 1000, delete_retention_ms=1000, end=4)
    assert contents(late.batches) == [(1, b"b", b"1"), (3, b"c", b"1")]
    assert late.tombstones_dropped == 1


def txn_batch(base: int, items, producer_id: int = 3) -> bytes:
    return batch(base, items, producer_id=producer_id, producer_epoch=0, base_sequence=0,
                 is_transactional=True)


def marker(base: int, commit: bool, producer_id: int = 3) -> bytes:
    return build_batch([Record(0, 0, b"\x00\x00\x00" + (b"\x01" if commit else b"\x00"),
                               b"\x00\x00\x00\x00\x00\x00")],
                       base_offset=base, producer_id=producer_id, producer_epoch=0,
                       is_transactional=True, is_control=True, base_timestamp=NOW - 10_000)


def test_aborted_records_go_and_never_hide_a_committed_value():
    log = [batch(0, [(b"a", b"committed")]), txn_batch(1, [(b"a", b"aborted")]),
           marker(2, commit=False), batch(3, [(b"z", b"1")])]
    result = clean_batches(log, now_ms=NOW, delete_retention_ms=1000, end=4, dirty_from=0)
    # the abort marker outlives its data by delete.retention.ms: it gets a horizon now
    assert contents(result.batches) == [(0, b"a", b"committed"), (2, b"\x00\x00\x00\x00",
                                        b"\x00\x00\x00\x00\x00\x00"), (3, b"z", b"1")]
    kept_marker = parse_batch_header(result.batches[1])
    assert kept_marker.is_control and kept_marker.has_delete_horizon_ms
    assert result.next_horizon == NOW + 1000
    late = clean_batches(result.batches, now_ms=NOW + 1000, delete_retention_ms=1000, end=4,
                         dirty_from=4)
    assert contents(late.batches) == [(0, b"a", b"committed"), (3, b"z", b"1")]


def test_committed_records_are_compacted_and_their_marker_stays_while_they_do():
    log = [txn_batch(0, [(b"a", b"t1"), (b"b", b"t1")]), marker(2, commit=True),
           batch(3, [(b"a", b"p1")])]
    result = clean_batches(log, now_ms=NOW, delete_retention_ms=1000, end=4, dirty_from=0)
    assert contents(result.batches)[0] == (1, b"b", b"t1")  # a's committed value superseded
    assert bytes(result.batches[1]) == log[1]  # its transaction still has data: unchanged
    assert parse_batch_header(result.batches[0]).is_transactional
    # a later plain b supersedes the rest: the marker then gets its horizon
    log2 = [*result.batches, batch(4, [(b"b", b"p2")]), batch(5, [(b"z", b"1")])]
    again = clean_batches(log2, now_ms=NOW, delete_retention_ms=1000, end=6, dirty_from=4)
    assert [o for o, _, _ in contents(again.batches)] == [2, 3, 4, 5]
    assert parse_batch_header(again.batches[0]).has_delete_horizon_ms


def test_an_open_transaction_stops_the_cleanable_end():
    log = [batch(0, [(b"a", b"1")]), txn_batch(1, [(b"a", b"open")]),
           batch(2, [(b"a", b"2")]), batch(3, [(b"z", b"1")])]
    result = clean_batches(log, now_ms=NOW, delete_retention_ms=DAY, end=4, dirty_from=0)
    assert result.end == 1  # the last stable offset
    # nothing from the open transaction on is touched, and nothing below is superseded by
    # what lies above it
    assert [bytes(b) for b in result.batches] == log


def test_batches_at_or_above_the_cleanable_end_are_never_rewritten():
    log = [batch(0, [(b"a", b"1"), (b"a", b"2")])]
    offset_map = build_offset_map(log, 0, 1)  # the cleanable end cuts the batch
    cleaned = clean_batch(log[0], offset_map, now_ms=NOW, delete_retention_ms=DAY, end=1)
    assert cleaned.batch is log[0] and not cleaned.rebuilt


# -- a compacted stream object: its index row's offsets, with gaps ---------------------------

async def test_a_compacted_object_answers_an_offset_in_a_gap_with_the_next_batch():
    import uuid

    from mink.storage.stream_object import (
        StreamObjectError,
        StreamObjectReader,
        StreamObjectWriter,
        decode_footer,
    )

    # offsets 0..9 covered; batches kept at 3-4 and 8-9 (the others compacted away)
    kept = [batch(3, [(b"a", b"1"), (b"b", b"1")]), batch(8, [(b"c", b"1"), (b"d", b"1")])]
    writer = StreamObjectWriter(uuid.uuid4(), 0, index_interval=1, covers=(0, 9))
    for b in kept:
        writer.add(b)
    obj = b"".join(bytes(p) for p in writer.finish())
    footer = decode_footer(obj[writer.data_length:], writer.data_length)
    assert (footer.base_offset, footer.last_offset) == (0, 9)

    async def get(start: int, end: int) -> bytes:
        return obj[start:end]

    reader = StreamObjectReader(footer, get, block_size=64)
    for offset, first_batch in [(0, 3), (3, 3), (4, 3), (5, 8), (7, 8), (9, 8)]:
        base, last, data = await reader.read(offset, 1 << 20)
        assert base == min(offset, first_batch)  # the gap before the batch is covered
        assert parse_batch_header(data).base_offset == first_batch
        while last < 9:  # a read ends at its block's end; read_cold reads on from there
            _, last, more = await reader.read(last + 1, 1 << 20)
            assert more
        assert last == 9
    with pytest.raises(StreamObjectError):
        writer.add(batch(5, [(b"e", b"1")]))  # backwards


# -- plan_pass: the rows of its table --------------------------------------------------------

def rows(*spec):
    """(base, last, key kind, max timestamp): 'w' a WAL row, 's' a stream object row."""
    from mink.storage.compaction.store import Row

    return [Row(b, l, ("wal/x" if kind == "w" else f"stream/x/{b}"), 0, (l - b + 1) * 100, ts)
            for b, l, kind, ts in spec]


def test_plan_pass_rows():
    from mink.storage.compaction.store import CompactionSettings, plan_pass

    old = NOW - 10_000
    every = CompactionSettings(min_cleanable_dirty_ratio=0.5)
    # nothing tiered: nothing to do
    assert plan_pass(rows((0, 9, "w", old)), 0, NOW, every) is None
    # tiered rows up to the first WAL row: cleaned from the log start to its end
    plan = plan_pass(rows((0, 9, "s", old), (10, 19, "s", old), (20, 29, "w", old)), 0, NOW,
                     every)
    assert (plan.base_offset, plan.last_offset, plan.end, plan.dirty_from) == (0, 19, 20, 0)
    # min.compaction.lag.ms: the young row and everything after it wait
    lagged = CompactionSettings(min_compaction_lag_ms=5_000)
    plan = plan_pass(rows((0, 9, "s", old), (10, 19, "s", NOW - 1000)), 0, NOW, lagged)
    assert plan.end == 10
    # nothing dirty: nothing to do
    assert plan_pass(rows((0, 19, "s", old)), 20, NOW, every) is None
    # the dirty ratio: 10 of 30 offsets dirty (by bytes), below 0.5: wait ...
    three = rows((0, 9, "s", old), (10, 19, "s", old), (20, 29, "s", old))
    assert plan_pass(three, 20, NOW, every) is None
    plan = plan_pass(three, 20, NOW, CompactionSettings(min_cleanable_dirty_ratio=0.3))
    assert plan.dirty_from == 20 and round(plan.dirty_ratio, 2) == 0.33
    # ... unless max.compaction.lag.ms has passed for the first dirty row
    plan = plan_pass(three, 20, NOW, CompactionSettings(max_compaction_lag_ms=5_000))
    assert plan.forced
    # a tombstone horizon that has come makes a pass due with nothing dirty (KIP-534)
    assert plan_pass(rows((0, 19, "s", old)), 20, NOW, every, tombstone_horizon=NOW + 1) is None
    plan = plan_pass(rows((0, 19, "s", old)), 20, NOW, every, tombstone_horizon=NOW)
    assert plan.forced and plan.dirty_from == 20


# -- the offset map and a map that fills ------------------------------------------------------

def test_the_offset_map_against_a_dict_and_when_full():
    import random

    from mink.storage.compaction.offset_map import OffsetMap, slots_for

    rng = random.Random(5)
    offset_map = OffsetMap(slots_for(1 << 20, 5000))
    assert offset_map.slots == 8192 and offset_map.nbytes() == 24 * 8192
    reference: dict[bytes, int] = {}
    for offset in range(20_000):
        key = b"k%d" % rng.randrange(5000)
        assert offset_map.put(key, offset)
        reference[key] = offset
    assert len(offset_map) == len(reference)
    assert all(offset_map.get(k) == o for k, o in reference.items())
    assert offset_map.get(b"never") is None
    assert offset_map.superseded(b"k1", -1) and not offset_map.superseded(b"never", 0)
    # full: a new key is refused (nothing changes), a key already there still moves on
    small = OffsetMap(8)
    assert small.max_entries == 7
    assert all(small.put(b"%d" % i, i) for i in range(7))
    assert small.full and not small.put(b"new", 100) and small.get(b"new") is None
    assert small.put(b"3", 100) and small.get(b"3") == 100
    # within the buffer, never more slots than the keys need
    assert slots_for(1024 * 24) == 1024 and slots_for(1 << 30, 100) == 128


def test_a_map_filling_in_a_committed_transaction_stops_below_its_first_record_left_out():
    from mink.storage.compaction.cleaner import MapBuilder
    from mink.storage.compaction.offset_map import OffsetMap

    log = [batch(0, [(b"a", b"1")]), txn_batch(1, [(b"b", b"t"), (b"c", b"t")]),
           batch(3, [(b"d", b"1"), (b"a", b"2")]), marker(5, commit=True),
           batch(6, [(b"z", b"1")])]
    offset_map = OffsetMap(4)  # 3 keys
    builder = MapBuilder(offset_map, 0, 7)
    assert not builder.feed(log) and builder.full
    # a and b fitted; c (offset 2) did not: the map is good below 2
    assert builder.finish() == 2 and offset_map.limit == 2
    assert offset_map.get(b"a") == 4 and offset_map.get(b"b") == 1
    # a@0 has a later record (a@4), but at or above the limit: kept, never wrongly dropped
    assert not offset_map.superseded(b"a", 0)
    # streamed and cleaned below 2, the rest as it is
    from mink.storage.compaction.cleaner import BatchCleaner

    pass_ = BatchCleaner(offset_map, builder.decisions, now_ms=NOW, delete_retention_ms=DAY,
                         end=2)
    out = [pass_.clean(b, i == len(log) - 1) for i, b in enumerate(log)]
    assert [bytes(b) for b in out] == log

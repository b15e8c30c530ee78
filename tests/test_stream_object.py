"""The stream object format (mink/storage/stream_object.py): batches byte for byte, the
footer's sparse offset and time index, reads at any offset and by timestamp, block-aligned."""

from __future__ import annotations

import random
import uuid

import pytest

from mink.protocol.records import Record, build_batch, iter_batches, iter_records, patch_batch
from mink.storage.stream_object import (
    StreamObjectError,
    StreamObjectReader,
    StreamObjectWriter,
    decode_footer,
)

TOPIC = uuid.uuid4()


def make_batches(n: int, seed: int = 1, base_offset: int = 100):
    """n committed batches (offsets patched as a leader does), random sizes and timestamps
    that go back and forth (CreateTime is the producer's)."""
    rng = random.Random(seed)
    out = []
    offset = base_offset
    for i in range(n):
        count = rng.randint(1, 5)
        ts = 1_700_000_000_000 + i * 1000 + rng.randint(-3000, 3000)
        values = [bytes([i % 256]) * rng.randint(1, 3000) for _ in range(count)]
        batch = bytearray(build_batch([Record(j, j, None, v) for j, v in enumerate(values)],
                                      base_timestamp=ts))
        patch_batch(batch, 0, offset, 7)
        out.append(bytes(batch))
        offset += count
    return out


def build(batches, rows_of: int = 3, index_interval: int = 4096):
    writer = StreamObjectWriter(TOPIC, 2, index_interval=index_interval)
    for i in range(0, len(batches), rows_of):  # one add per index row (several batches)
        writer.add(b"".join(batches[i:i + rows_of]))
    return writer, b"".join(bytes(p) for p in writer.finish())


def reader_of(obj: bytes, data_length: int, block_size: int, gets: list | None = None):
    footer = decode_footer(obj[data_length:], data_length)

    async def get_block(start: int, end: int) -> bytes:
        blocks = [reader.block_range(n) for n in range(reader.blocks)]
        assert (start, end) in blocks, "reads are of whole blocks"
        if gets is not None:
            gets.append((start, end))
        return obj[start:end]

    reader = StreamObjectReader(footer, get_block, block_size)
    return reader


def records(batches):
    out = []
    for batch in batches:
        for header, data in iter_batches(batch):
            out += [(header.record_offset(r), header.record_timestamp(r), r.value)
                    for r in iter_records(data)]
    return out


def test_bytes_unchanged_and_footer_describes_them():
    batches = make_batches(200)
    writer, obj = build(batches)
    data = b"".join(batches)
    assert obj[:len(data)] == data, "the batches are stored exactly as committed"
    footer = decode_footer(obj[len(data):], len(data))
    assert (footer.base_offset, footer.last_offset) == (100, writer.last_offset)
    assert footer.batch_count == 200 and footer.data_length == len(data)
    headers = [h for b in batches for h, _ in iter_batches(b)]
    assert footer.max_timestamp == max(h.max_timestamp for h in headers)
    # Sparse: one entry per index interval at a batch boundary, never inside a batch.
    starts = {}
    position = 0
    for h in headers:
        starts[position] = h
        position += h.size
    assert 1 < len(footer.index) <= len(data) // 4096 + 1
    running = -1
    for entry in footer.index:
        h = starts[entry.position]
        assert entry.offset_delta == h.base_offset - 100
        assert entry.max_timestamp_before == max(
            [x.max_timestamp for p, x in starts.items() if p < entry.position], default=-1)
        running = entry.max_timestamp_before
    assert running >= -1


@pytest.mark.parametrize("block_size", [512, 4096, 1 << 20])
async def test_read_at_every_offset_gives_the_batch_holding_it(block_size):
    batches = make_batches(120, seed=3)
    writer, obj = build(batches)
    data_length = len(b"".join(batches))
    reader = reader_of(obj, data_length, block_size)
    expected = records(batches)
    for offset in range(100, writer.last_offset + 1):
        base, last, got = await reader.read(offset, 1)  # one batch: the one holding it
        (header, _), = list(iter_batches(got))
        assert header.base_offset <= offset <= header.last_offset == last
        assert base == header.base_offset
        assert bytes(got) in batches
    # Reads of any size walk the whole object, byte for byte, in order.
    for max_bytes in (1, 3000, 50_000, 10 << 20):
        offset, out = 100, []
        while offset <= writer.last_offset:
            base, last, got = await reader.read(offset, max_bytes)
            assert base <= offset and len(got) > 0
            assert len(got) <= max_bytes or len(list(iter_batches(got))) == 1
            out.append(bytes(got))
            offset = last + 1
        assert b"".join(out) == b"".join(batches)
        assert records(out) == expected


async def test_first_batch_reaching_a_timestamp_matches_a_full_scan():
    batches = make_batches(150, seed=5)
    _, obj = build(batches, index_interval=2048)
    data_length = len(b"".join(batches))
    gets: list = []
    reader = reader_of(obj, data_length, 4096, gets)
    headers = [h for b in batches for h, _ in iter_batches(b)]
    for ts in [0, *sorted({h.max_timestamp for h in headers}), headers[0].max_timestamp - 1,
               max(h.max_timestamp for h in headers) + 1]:
        expected = next((h for h in headers if h.max_timestamp >= ts), None)
        got = await reader.first_batch_reaching(ts)
        if expected is None:
            assert got is None
        else:
            assert got is not None and got[0] == expected
            assert bytes(got[1]) in batches
    # A lookup scans at most about one index interval (plus the batch found).
    gets.clear()
    await reader.first_batch_reaching(headers[len(headers) // 2].max_timestamp)
    assert sum(end - start for start, end in gets) <= 4 * 4096


def test_a_gap_or_a_torn_batch_is_refused():
    batches = make_batches(5)
    writer = StreamObjectWriter(TOPIC, 0)
    writer.add(batches[0])
    with pytest.raises(StreamObjectError):
        writer.add(batches[2])  # offsets do not follow
    with pytest.raises(StreamObjectError):
        StreamObjectWriter(TOPIC, 0).add(batches[0][:-1])
    with pytest.raises(StreamObjectError):
        StreamObjectWriter(TOPIC, 0).finish()
    _, obj = build(batches)
    data_length = len(b"".join(batches))
    with pytest.raises(StreamObjectError):
        decode_footer(obj[data_length + 1:], data_length)
    with pytest.raises(StreamObjectError):
        decode_footer(obj[data_length:], data_length - 1)


async def test_a_read_is_a_view_of_one_block_and_blocks_begin_at_batches():
    """A Fetch's read of a stream object is a view of one cached block (sent as it is by the
    Fetch encoder), never a copy: the reader's blocks begin at index entries (batch starts),
    each the first one `block_size` or more after the previous block's beginning, so no
    batch lies across two, whatever the batches' sizes against the block size."""
    for block_size, interval in ((4096, 4096), (1000, 512), (20_000, 4096)):
        batches = make_batches(120, seed=5)
        writer, obj = build(batches, index_interval=interval)
        data_length = len(b"".join(batches))
        reader = reader_of(obj, data_length, block_size)
        starts, position = {}, 0
        for batch in batches:
            (header, _), = list(iter_batches(batch))
            starts[header.base_offset] = position
            position += len(batch)
        bounds = [reader.block_range(n) for n in range(reader.blocks)]
        assert bounds[0][0] == 0 and bounds[-1][1] == data_length
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])), "contiguous"
        batch_starts = set(starts.values())
        assert all(s in batch_starts for s, _ in bounds), "blocks begin at batches"
        assert all(e - s >= block_size for s, e in bounds[:-1])
        biggest = max(len(b) for b in batches)
        assert all(e - s < block_size + interval + biggest for s, e in bounds)
        offset, reads = 100, 0
        while offset <= writer.last_offset:
            base, last, got = await reader.read(offset, 10 << 20)
            start = starts[base]
            (block,) = [(s, e) for s, e in bounds if s <= start < e]
            assert len(got.obj) == block[1] - block[0], "a view of the cached block"
            assert start + len(got) == block[1], "to the block's end"
            offset, reads = last + 1, reads + 1
        assert reads == len(bounds), (block_size, interval)

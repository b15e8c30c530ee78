"""Stream objects (seed 000's tiering): one partition's consecutive committed batches, byte
for byte as they were committed (offsets, leader epochs and CRCs unchanged), followed by a
footer that indexes them.

    [batch][batch]...[batch][footer: msgpack][footer length: u32][b"MSTR"]
    0                       data_length                               end of object

The index row of a stream object (`batch_index`) covers the whole object's offsets with
byte_start = 0 and byte_end = data_length, so a reader finds the footer with one ranged GET
from byte_end to the end of the object, and the batches it needs with ranged GETs of whole
blocks after that (each from a batch start, about a block size long: StreamObjectReader;
shared through the node's block cache by readers of any size).

The footer's index is sparse, one entry at least every `index_interval` bytes at a batch
boundary: it is Kafka's offset index (`.index`: offset -> position) and time index
(`.timeindex`) in one array. Each entry carries the largest batch max timestamp of the batches
*before* it, so "the first batch whose max timestamp reaches ts" lies between the last entry
whose value is below ts and the first entry whose value is not.

No broker import here (storage does not import the broker); nothing here awaits except the
reader, which is handed its ranged-GET function.
"""

from __future__ import annotations

import bisect
import copy
import struct
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator

import msgspec
import trio

from mink.protocol.records import (
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    BatchError,
    BatchHeader,
    parse_batch_header,
)

STREAM_OBJECT_PREFIX = "stream/"
STREAM_MAGIC = b"MSTR"
FORMAT_VERSION = 1
TRAILER = struct.Struct(">I4s")  # footer length, magic
# Kafka's index.interval.bytes is 4096 for segments of 1 GiB read through mmap; here each
# lookup costs a scan of at most this many bytes of cached blocks, and the footer of a 64 MiB
# object stays about 25 KB.
DEFAULT_INDEX_INTERVAL = 64 * 1024
DEFAULT_BLOCK_SIZE = 1024 * 1024

_BATCH_PREFIX = struct.Struct(">qi")  # baseOffset, batchLength
_LAST_OFFSET_DELTA = struct.Struct(">i")


class StreamObjectError(Exception):
    """The bytes are not a stream object, or not the one the index row describes."""


class IndexEntry(msgspec.Struct, array_like=True, frozen=True):
    offset_delta: int          # base offset of the batch here, minus the object's base offset
    position: int              # byte position of that batch in the object
    max_timestamp_before: int  # largest max timestamp of the batches before it (-1: none)


class StreamFooter(msgspec.Struct, frozen=True):
    version: int
    topic_id: str
    partition: int
    base_offset: int
    last_offset: int
    data_length: int
    batch_count: int
    max_timestamp: int
    index_interval: int
    index: list[IndexEntry]


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(StreamFooter).decode


def is_stream_object(key: str) -> bool:
    return key.startswith(STREAM_OBJECT_PREFIX)


def stream_object_key(topic_id: uuid.UUID, partition: int, base_offset: int,
                      last_offset: int, unique: str) -> str:
    """`unique` tells apart two attempts at the same range (a round retried by a new
    coordinator): an upload never overwrites another one's object."""
    return (f"{STREAM_OBJECT_PREFIX}{topic_id}/{partition}/"
            f"{base_offset:020d}-{last_offset:020d}-{unique}")


def read_batch_header(buf: memoryview, position: int) -> BatchHeader:
    """The v2 batch header at `position`; StreamObjectError if there is none."""
    try:
        return parse_batch_header(buf, position)
    except BatchError as exc:
        raise StreamObjectError(f"no batch header at byte {position}: {exc}") from None


def walk_batches(view: memoryview) -> Iterator[tuple[BatchHeader, int]]:
    """(header, position) of each batch of `view`, which must be whole batches."""
    position = 0
    while position < len(view):
        if len(view) - position < RECORD_BATCH_OVERHEAD:
            raise StreamObjectError(f"{len(view) - position} trailing bytes are no batch")
        header = read_batch_header(view, position)
        size = header.batch_length + LOG_OVERHEAD
        if size < RECORD_BATCH_OVERHEAD or position + size > len(view):
            raise StreamObjectError(f"batch at offset {header.base_offset} is truncated")
        yield header, position
        position += size


class StreamObjectWriter:
    """Collects a partition's committed batches in offset order and builds the object.
    `add` takes the bytes of one index row (whole batches), `add_batches` the headers of
    one walked elsewhere; nothing is copied: `finish` returns the parts to upload
    (scatter-gather), or to compose from the ranges they came from."""

    def __init__(self, topic_id: uuid.UUID, partition: int, *,
                 index_interval: int = DEFAULT_INDEX_INTERVAL,
                 covers: tuple[int, int] | None = None) -> None:
        self.topic_id = topic_id
        self.partition = partition
        self.index_interval = index_interval
        # A compacted object (mink/storage/compaction/): the offsets its index row covers,
        # (base, last); its batches lie within them with gaps, where records were compacted
        # away. None: the batches follow each other and cover exactly their own offsets.
        self.covers = covers
        self.parts: list = []  # what add and add_batches were given for each part
        self.index: list[IndexEntry] = []
        self.base_offset: int | None = None
        self.next_offset: int | None = None
        self.data_length = 0
        self.batch_count = 0
        self.max_timestamp = -1
        self._last_indexed = -1  # position of the last index entry

    def add(self, data: bytes | bytearray | memoryview) -> None:
        """Whole v2 batches continuing exactly at the next offset; StreamObjectError
        otherwise (the bytes read back are not what the index rows promised)."""
        view = memoryview(data)
        self.add_batches(walk_batches(view), view, len(view))

    def add_batches(self, batches: Iterable[tuple[BatchHeader, int]], part: object,
                    length: int) -> None:
        """Whole batches walked elsewhere, `length` bytes in all: (header, position within
        them) in order; `part` is what `finish` gives back for these bytes (their bytes, or
        a range of the object they are read from)."""
        for header, position in batches:
            if self.next_offset is not None and (
                    header.base_offset < self.next_offset if self.covers is not None
                    else header.base_offset != self.next_offset):
                raise StreamObjectError(f"batch at offset {header.base_offset} does not "
                                        f"follow offset {self.next_offset - 1}")
            if self.covers is not None and not (
                    self.covers[0] <= header.base_offset
                    and header.last_offset <= self.covers[1]):
                raise StreamObjectError(f"batch at offset {header.base_offset} is outside "
                                        f"the object's offsets {self.covers}")
            if self.base_offset is None:
                self.base_offset = header.base_offset
                self._index_base = (header.base_offset if self.covers is None
                                    else self.covers[0])
            at = self.data_length + position
            if self._last_indexed < 0 or at - self._last_indexed >= self.index_interval:
                self.index.append(IndexEntry(header.base_offset - self._index_base, at,
                                             self.max_timestamp))
                self._last_indexed = at
            self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
            self.next_offset = header.last_offset + 1
            self.batch_count += 1
        self.parts.append(part)
        self.data_length += length

    @property
    def last_offset(self) -> int:
        if self.next_offset is None:
            raise StreamObjectError("no batch was added")
        return self.next_offset - 1

    def footer(self) -> StreamFooter:
        if self.base_offset is None:
            raise StreamObjectError("no batch was added")
        base, last = self.covers or (self.base_offset, self.last_offset)
        return StreamFooter(
            version=FORMAT_VERSION, topic_id=str(self.topic_id), partition=self.partition,
            base_offset=base, last_offset=last,
            data_length=self.data_length, batch_count=self.batch_count,
            max_timestamp=self.max_timestamp, index_interval=self.index_interval,
            index=self.index)

    def finish(self) -> list:
        encoded = _encode(self.footer())
        return [*self.parts, encoded, TRAILER.pack(len(encoded), STREAM_MAGIC)]


def decode_footer(tail: bytes | memoryview, data_length: int) -> StreamFooter:
    """The footer from the bytes after the data (what a ranged GET from byte_end returns)."""
    if len(tail) < TRAILER.size:
        raise StreamObjectError("object too short for a stream object trailer")
    length, magic = TRAILER.unpack_from(tail, len(tail) - TRAILER.size)
    if magic != STREAM_MAGIC or length != len(tail) - TRAILER.size:
        raise StreamObjectError("no stream object footer after the data")
    try:
        footer = _decode(memoryview(tail)[:length])
    except msgspec.DecodeError as exc:
        raise StreamObjectError(f"undecodable stream object footer: {exc}") from None
    if footer.data_length != data_length or not footer.index:
        raise StreamObjectError(f"footer describes {footer.data_length} bytes of data, "
                                f"the index row {data_length}")
    return footer


RangeGet = Callable[[int, int], Awaitable[bytes]]


class StreamObjectReader:
    """Reads one stream object through its footer and whole blocks.

    `get_block(start, end)` returns the object's bytes [start, end); the reader only ever
    asks for whole blocks, so a block cache under it is shared by readers of any size and a
    sequential reader reads ahead. A block begins at the first index entry `block_size` or
    more after the previous block's beginning (every reader of the object draws the same
    ones from its footer): it begins and ends at batch boundaries, so no batch lies across
    two blocks, and a read is a view of one cached block, never a copy, whatever the
    batches' sizes."""

    def __init__(self, footer: StreamFooter, get_block: RangeGet,
                 block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.footer = footer
        self.get_block = get_block
        self.block_size = block_size
        self._offsets = [e.offset_delta for e in footer.index]
        self._max_before = [e.max_timestamp_before for e in footer.index]
        starts = [0]
        for entry in footer.index:
            if entry.position >= starts[-1] + block_size and entry.position < footer.data_length:
                starts.append(entry.position)
        self._block_starts = starts
        self._block_ends = [*starts[1:], footer.data_length]
        # (first, last) block numbers the reads of this reader asked for (read-ahead).
        self.blocks_read: tuple[int, int] | None = None

    def fresh(self) -> StreamObjectReader:
        """A reader of the same object sharing this one's lookups (drawn from the footer
        once), with no reads of its own yet (`blocks_read`)."""
        other = copy.copy(self)
        other.blocks_read = None
        return other

    @property
    def blocks(self) -> int:
        return len(self._block_starts)

    def block_range(self, n: int) -> tuple[int, int]:
        """Block `n`'s bytes [start, end) of the data (0 <= n < blocks)."""
        return self._block_starts[n], self._block_ends[n]

    def _block_of(self, position: int) -> int:
        return bisect.bisect_right(self._block_starts, position) - 1

    async def _bytes(self, start: int, end: int) -> memoryview:
        """Bytes [start, end) of the data, assembled from whole blocks."""
        end = min(end, self.footer.data_length)
        if start >= end:
            return memoryview(b"")
        first, last = self._block_of(start), self._block_of(end - 1)
        if self.blocks_read is None:
            self.blocks_read = (first, last)
        else:
            self.blocks_read = (min(first, self.blocks_read[0]), max(last, self.blocks_read[1]))
        blocks: list[bytes] = [b""] * (last - first + 1)

        async def block(n: int) -> None:
            blocks[n - first] = await self.get_block(*self.block_range(n))

        if first == last:
            await block(first)
        else:  # the blocks of one read at once
            async with trio.open_nursery() as nursery:
                for n in range(first, last + 1):
                    nursery.start_soon(block, n)
        skip = start - self._block_starts[first]
        if first == last:
            return memoryview(blocks[0])[skip:skip + end - start]
        # across blocks (not asked for by read(), which stays in one): a copy of the bytes
        # asked for only, not of the whole blocks
        views = [memoryview(b) for b in blocks]
        views[0] = views[0][skip:]
        views[-1] = views[-1][:end - self._block_starts[last]]
        return memoryview(b"".join(views))

    async def _header(self, position: int) -> BatchHeader:
        return parse_batch_header(await self._bytes(position, position + RECORD_BATCH_OVERHEAD))

    def _entry_for_offset(self, offset: int) -> int:
        i = bisect.bisect_right(self._offsets, offset - self.footer.base_offset) - 1
        return self.footer.index[max(i, 0)].position

    async def read(self, offset: int, max_bytes: int) -> tuple[int, int, memoryview]:
        """Whole batches from the one holding `offset`, at most `max_bytes` of them (the
        first always whole, KIP-74) and no further than the end of the block the first one
        starts in (or that batch's end): (base offset, last offset, bytes)."""
        footer = self.footer
        if not footer.base_offset <= offset <= footer.last_offset:
            raise StreamObjectError(f"offset {offset} is outside the object's "
                                    f"[{footer.base_offset}, {footer.last_offset}]")
        position = self._entry_for_offset(offset)
        while True:  # at most one index interval of headers
            if position >= footer.data_length:  # compacted away up to the object's end
                return offset, footer.last_offset, memoryview(b"")
            header = await self._header(position)
            if header.last_offset >= offset:
                break
            position += header.batch_length + LOG_OVERHEAD
        first_size = header.batch_length + LOG_OVERHEAD
        # Up to the end of the block the batch starts in (a view of the cached block, no
        # copy; a block ends at a batch boundary), or to the batch's own end should a batch
        # run past its block (an object whose footer does not index its batch starts): the
        # caller reads on from `last + 1` for more.
        block_end = self._block_ends[self._block_of(position)]
        end_at = max(min(position + max_bytes, block_end), position + first_size)
        data = await self._bytes(position, end_at)
        end = 0
        last = header.last_offset
        while end + 27 <= len(data):
            base, length = _BATCH_PREFIX.unpack_from(data, end)
            if end + length + LOG_OVERHEAD > len(data):
                break
            (delta,) = _LAST_OFFSET_DELTA.unpack_from(data, end + 23)
            if end > 0 and end + length + LOG_OVERHEAD > max_bytes:
                break
            end += length + LOG_OVERHEAD
            last = base + delta
        # In a compacted object `offset` may fall in a gap before this batch: the offsets
        # between are records compacted away, so the bytes returned cover from `offset`.
        return min(header.base_offset, offset), last, data[:end]

    async def first_batch_reaching(self, timestamp: int) -> tuple[BatchHeader, memoryview] | None:
        """The first batch whose max timestamp is at least `timestamp` (ListOffsets by
        timestamp), found between two index entries; None if no batch reaches it."""
        footer = self.footer
        if footer.max_timestamp < timestamp:
            return None
        i = bisect.bisect_left(self._max_before, timestamp) - 1
        position = footer.index[max(i, 0)].position
        while position < footer.data_length:
            header = await self._header(position)
            size = header.batch_length + LOG_OVERHEAD
            if header.max_timestamp >= timestamp:
                return header, await self._bytes(position, position + size)
            position += size
        return None


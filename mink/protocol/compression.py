"""Kafka record-batch compression codecs (attribute bits 0-2), via cramjam.

Mink stores batches compressed exactly as the producer sent them; it decompresses
each produced batch once to validate its records (`log_validator.py`, as Kafka
does), and for reading records back and building batches ourselves.

`decompress(..., max_size)` is the Produce path: bounded, and strict on framing, so that what
is acknowledged every client decodes to the same bytes (see `_snappy_bounded`,
`_gzip_bounded`, `_lz4_bound`); without `max_size` it reads back leniently what is stored.
"""

from __future__ import annotations

import mmap
import struct
import zlib

import cramjam

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4

# Names as Kafka's `compression.type` config spells them.
CODEC_NAMES: dict[int, str] = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
CODEC_IDS: dict[str, int] = {name: codec for codec, name in CODEC_NAMES.items()}

# snappy-java (xerial) stream framing, which the Java client writes:
# 8-byte magic, int32 version, int32 min-compatible version, then blocks of
# [int32 compressed length][raw snappy block].
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_SIZE = 32 * 1024  # snappy-java's default uncompressed block size
_INT32 = struct.Struct(">i")


class UnknownCodec(ValueError):
    """Attribute bits 0-2 hold a value that is not a Kafka codec (5-7)."""


class DecompressedTooLarge(ValueError):
    """The payload decompresses (or says it decompresses) to more than the limit given."""

    def __init__(self, codec: int, limit: int, size: int | None = None):
        self.codec = codec
        self.limit = limit
        self.size = size  # what the payload declares or bounds, when known without decoding
        what = f"{size} bytes" if size is not None else "more"
        super().__init__(f"{CODEC_NAMES.get(codec, codec)} records decompress to {what}, "
                         f"over the limit of {limit} bytes")


def decompress(codec: int, data: bytes | bytearray | memoryview,
               max_size: int | None = None) -> bytes | bytearray:
    """Decompress a batch's records section.

    With `max_size`, a payload whose output would be larger raises `DecompressedTooLarge`
    without that output ever being allocated (a decompression bomb costs at most
    `max_size` bytes): snappy and lz4/zstd frames are bounded from their headers before
    anything is decoded, gzip is inflated with zlib's `max_length`.

    Raises `UnknownCodec` for codec ids 5-7 and `cramjam.DecompressionError`
    (or `ValueError` for broken framing) on malformed input.
    """
    if max_size is not None:
        return _decompress_bounded(codec, memoryview(data), max_size)
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        # cramjam reads concatenated gzip members, as Java's GZIPInputStream does.
        return bytes(cramjam.gzip.decompress(data))
    if codec == SNAPPY:
        return _snappy_decompress(data)
    if codec == LZ4:
        # Kafka (magic >= 1) uses the standard LZ4 frame format.
        return bytes(cramjam.lz4.decompress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.decompress(data))
    raise UnknownCodec(f"unknown compression codec {codec}")


def compress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Compress a records section the way the Java producer does."""
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        return _snappy_compress_xerial(data)
    if codec == LZ4:
        # Independent blocks, as KafkaLZ4BlockOutputStream writes them: Java readers refuse a
        # frame without the block-independence flag (KIP-57), and so does the validator.
        compressor = cramjam.lz4.Compressor(block_linked=False)
        compressor.compress(data)
        return bytes(compressor.finish())
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise UnknownCodec(f"unknown compression codec {codec}")


def _snappy_decompress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    # Java producers write xerial framing; librdkafka writes raw snappy. Java's
    # SnappyInputStream falls back to raw snappy when the magic is absent; so do we.
    if len(view) < 16 or view[:8] != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(view))
    # The version/compat fields are ignored, as snappy-java does not check them
    # strictly and some producers write them little-endian. (This reads back what is
    # stored; a produced batch goes through `_snappy_bounded`, which refuses such headers.)
    out = bytearray()
    pos, end = 16, len(view)
    while pos < end:
        if end - pos < 4:
            raise ValueError("truncated xerial snappy block length")
        (block_len,) = _INT32.unpack_from(view, pos)
        pos += 4
        if block_len < 0 or block_len > end - pos:
            raise ValueError("invalid xerial snappy block length")
        out += cramjam.snappy.decompress_raw(view[pos : pos + block_len])
        pos += block_len
    return bytes(out)


def _snappy_compress_xerial(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), _XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK_SIZE]))
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


# -- bounded decompression (a Produce batch is untrusted input) ----------------------------
#
# cramjam has no output cap: `decompress` grows its output until the payload ends, so a
# 6 KB zstd payload of zeros becomes 200 MiB. Each codec is bounded before, or while, it is
# decoded, and the limit check never needs the whole output in memory.

_UINT32_LE = struct.Struct("<I")
_UINT64_LE = struct.Struct("<Q")
_SKIPPABLE_MIN, _SKIPPABLE_MAX = 0x184D2A50, 0x184D2A5F  # skippable frames (zstd reads them)
_LZ4_MAGIC = 0x184D2204
_LZ4_BLOCK_MAX = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}  # BD bits 6-4
_ZSTD_MAGIC = 0xFD2FB528
_GZIP_STEP = 1 << 20
_ZSTD_BLOCK_MAX = 128 << 10  # Block_Maximum_Size is at most 128 KiB (RFC 8878 3.1.1.2.4)


def _decompress_bounded(codec: int, view: memoryview, limit: int) -> bytes | bytearray:
    if codec == NONE:
        if len(view) > limit:
            raise DecompressedTooLarge(codec, limit, len(view))
        return bytes(view)
    if codec == GZIP:
        return _gzip_bounded(view, limit)
    if codec == SNAPPY:
        return _snappy_bounded(view, limit)
    if codec == LZ4:
        bound = _lz4_bound(view, limit)
        module = cramjam.lz4
    elif codec == ZSTD:
        bound = _zstd_bound(view, limit)
        module = cramjam.zstd
    else:
        raise UnknownCodec(f"unknown compression codec {codec}")
    if bound <= limit:
        # The headers bound the output (each block decodes to at most its maximum size, which
        # the decoders enforce): decode as usual, no cap needed.
        out = module.decompress(view)
        if len(out) > bound:  # a decoder that broke the format's block limit
            raise ValueError(f"{CODEC_NAMES[codec]} output exceeds what its frames allow")
        return bytes(out)
    return _into_capped_buffer(module, codec, view, limit)


def _into_capped_buffer(module, codec: int, view: memoryview, limit: int) -> bytes:
    """Decode into a buffer of `limit + 1` bytes that the decoder cannot grow: a payload whose
    header bound is loose, or a bomb made of compressed blocks. The buffer is an anonymous
    mapping, so only the pages actually written take memory."""
    with mmap.mmap(-1, limit + 1) as buffer:
        try:
            written = module.decompress_into(view, buffer)
        except cramjam.DecompressionError as exc:
            if "failed to write whole buffer" in str(exc):
                raise DecompressedTooLarge(codec, limit) from None
            raise
        if written > limit:
            raise DecompressedTooLarge(codec, limit)
        return buffer[:written]


def _gzip_bounded(view: memoryview, limit: int) -> bytes:
    """Inflate member after member, at most 1 MiB a step and never past one byte over the
    limit: a bomb costs the limit, once.

    Then refuse more than one member, though Java's GZIPInputStream reads them all:
    librdkafka inflates the first member only and its consumers silently skip the records of
    the others (a producer writes one member). Counted at the end, so that a bomb of many
    members is still found too large."""
    parts = []
    total = members = 0
    data = view
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not inflater.eof:
            wanted = min(_GZIP_STEP, limit - total + 1)
            try:
                part = inflater.decompress(data, wanted)
            except zlib.error as exc:
                raise ValueError(f"invalid gzip data: {exc}") from None
            total += len(part)
            if total > limit:
                raise DecompressedTooLarge(GZIP, limit)
            parts.append(part)
            data = inflater.unconsumed_tail
            if not inflater.eof and len(part) < wanted:  # the input ran out mid-member
                raise ValueError("truncated gzip member")
        data = inflater.unused_data
        members += 1
        if not data:
            if members > 1:
                raise ValueError(f"{members} gzip members: librdkafka reads the first only")
            return parts[0] if len(parts) == 1 else b"".join(parts)


def _snappy_bounded(view: memoryview, limit: int) -> bytes:
    """Every raw snappy block starts with its uncompressed length (a varint), which the decoder
    holds it to: sum them before decoding anything.

    Stricter than `_snappy_decompress` on the xerial header, as every consumer must read what
    is acknowledged: aiokafka takes a stream for xerial only when all 16 header bytes are
    snappy-java's (version 1, compatible 1) and decodes anything else as raw snappy, which a
    stream starting with the magic never is; librdkafka needs more than 20 bytes. A stream
    with the magic and any other header is refused (no known producer writes one)."""
    if view[:8] == _XERIAL_MAGIC and (len(view) <= 20 or view[:16] != _XERIAL_HEADER):
        raise ValueError("xerial snappy header other than snappy-java's version 1/1, or no "
                         "block after it")
    if view[:8] != _XERIAL_MAGIC:
        size = cramjam.snappy.decompress_raw_len(view)
        if size > limit:
            raise DecompressedTooLarge(SNAPPY, limit, size)
        return bytes(cramjam.snappy.decompress_raw(view))
    blocks = []
    total = 0
    pos, end = 16, len(view)
    while pos < end:
        if end - pos < 4:
            raise ValueError("truncated xerial snappy block length")
        (block_len,) = _INT32.unpack_from(view, pos)
        pos += 4
        if block_len < 0 or block_len > end - pos:
            raise ValueError("invalid xerial snappy block length")
        block = view[pos : pos + block_len]
        total += cramjam.snappy.decompress_raw_len(block)
        if total > limit:
            raise DecompressedTooLarge(SNAPPY, limit, total)
        blocks.append(block)
        pos += block_len
    out = bytearray()
    for block in blocks:
        out += cramjam.snappy.decompress_raw(block)
    return bytes(out)


def _lz4_bound(view: memoryview, limit: int) -> int:
    """An upper bound of the decoded size of an LZ4 frame, from its headers only: a frame's
    declared content size over `limit` refuses it at once; otherwise each uncompressed block
    counts its size and each compressed block the frame's maximum block size.

    The payload must be exactly one frame, as Kafka's readers take it: librdkafka refuses
    anything after the first frame, kafka-python's lz4 reads the first frame only, and
    KafkaLZ4BlockInputStream wants the LZ4 magic first (no skippable frame), independent
    blocks and no dictionary id; a producer writes nothing else."""
    end, bound = len(view), 0
    if _u32(view, 0, end) != _LZ4_MAGIC:
        raise ValueError("not an LZ4 frame")
    if end < 7:
        raise ValueError("truncated LZ4 frame descriptor")
    flags, block_descriptor = view[4], view[5]
    block_max = _LZ4_BLOCK_MAX.get((block_descriptor >> 4) & 7)
    if flags >> 6 != 1 or block_max is None:
        raise ValueError("invalid LZ4 frame descriptor")
    if not flags & 0x20 or flags & 0x01:
        raise ValueError("LZ4 frame with dependent blocks or a dictionary id: Kafka's readers "
                         "refuse it")
    pos = 6
    if flags & 0x08:  # content size
        if end - pos < 8:
            raise ValueError("truncated LZ4 frame descriptor")
        (content_size,) = _UINT64_LE.unpack_from(view, pos)
        if content_size > limit:
            raise DecompressedTooLarge(LZ4, limit, content_size)
        pos += 8
    pos += 1  # header checksum
    block_checksum = 4 if flags & 0x10 else 0
    while True:
        size = _u32(view, pos, end)
        pos += 4
        if size == 0:  # end mark
            break
        if size & 0x80000000:  # stored uncompressed
            size &= 0x7FFFFFFF
            bound += size
        else:
            bound += block_max
        pos += size + block_checksum
    if flags & 0x04:  # content checksum
        pos += 4
    if pos > end:
        raise ValueError("truncated LZ4 frame")
    if pos != end:
        raise ValueError("bytes after the LZ4 frame")
    return bound


def _zstd_bound(view: memoryview, limit: int) -> int:
    """An upper bound of the decoded size of zstd frames, from their block headers only: raw
    and RLE blocks count their exact size, compressed blocks the 128 KiB block maximum; a
    frame's declared content size over `limit` refuses it at once."""
    pos, end, bound = 0, len(view), 0
    while pos < end:
        magic = _u32(view, pos, end)
        if _SKIPPABLE_MIN <= magic <= _SKIPPABLE_MAX:
            pos += 8 + _u32(view, pos + 4, end)
            continue
        if magic != _ZSTD_MAGIC:
            raise ValueError("not a zstd frame")
        if end - pos < 6:
            raise ValueError("truncated zstd frame header")
        descriptor = view[pos + 4]
        if descriptor & 0x08:
            raise ValueError("reserved bit set in a zstd frame header")
        pos += 5
        single_segment = descriptor & 0x20
        if not single_segment:
            pos += 1  # window descriptor
        pos += (0, 1, 2, 4)[descriptor & 3]  # dictionary id
        size_bytes = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
        if size_bytes:
            if end - pos < size_bytes:
                raise ValueError("truncated zstd frame header")
            content_size = int.from_bytes(view[pos : pos + size_bytes], "little")
            if size_bytes == 2:
                content_size += 256
            if content_size > limit:
                raise DecompressedTooLarge(ZSTD, limit, content_size)
            pos += size_bytes
        while True:
            if end - pos < 3:
                raise ValueError("truncated zstd block header")
            block_header = view[pos] | view[pos + 1] << 8 | view[pos + 2] << 16
            pos += 3
            block_type = (block_header >> 1) & 3
            block_size = block_header >> 3
            if block_type == 0:  # raw
                bound += block_size
                pos += block_size
            elif block_type == 1:  # RLE: one byte repeated block_size times
                bound += block_size
                pos += 1
            elif block_type == 2:  # compressed
                bound += _ZSTD_BLOCK_MAX
                pos += block_size
            else:
                raise ValueError("reserved zstd block type")
            if block_header & 1:  # last block
                break
        if descriptor & 0x04:  # content checksum
            pos += 4
        if pos > end:
            raise ValueError("truncated zstd frame")
    return bound


def _u32(view: memoryview, pos: int, end: int) -> int:
    if end - pos < 4:
        raise ValueError("truncated frame")
    return _UINT32_LE.unpack_from(view, pos)[0]

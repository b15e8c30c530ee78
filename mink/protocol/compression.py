"""Kafka record-batch compression codecs (attribute bits 0-2), via cramjam.

Mink stores batches compressed exactly as the producer sent them; it decompresses
each produced batch once to validate its records (`log_validator.py`, as Kafka
does), and for reading records back and building batches ourselves.
"""

from __future__ import annotations

import struct

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


def decompress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Decompress a batch's records section.

    Raises `UnknownCodec` for codec ids 5-7 and `cramjam.DecompressionError`
    (or `ValueError` for a broken xerial frame) on malformed input.
    """
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
        return bytes(cramjam.lz4.compress(data))
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
    # strictly and some producers write them little-endian.
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

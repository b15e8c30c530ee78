"""Decompression bombs for every Kafka codec: small payloads (under Kafka's default
max.message.bytes of 1 MiB) that expand far past Mink's decompressed-size limit (64 MiB),
built in 1 MiB steps so that the test process never holds the expanded data."""

from __future__ import annotations

import functools
import random
import struct
import zlib

import lz4.frame
import zstandard

from mink.protocol import compression as codecs
from mink.protocol.records import Record
from tests.support.batches import records_batch

_CHUNK = 1 << 20
_ZEROS = bytes(_CHUNK)
# Not a run of one byte: zstd writes compressed blocks, not RLE blocks, whose 128 KiB
# per-block bound is the loosest a frame can claim.
_PATTERN = (b"0123456789abcdef" * (_CHUNK // 16))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@functools.cache
def bomb(kind: str) -> tuple[int, bytes, int]:
    """(codec, compressed payload, expanded size) for `kind`."""
    if kind == "gzip":  # 256 MiB of zeros, one gzip member
        size = 256 * _CHUNK
        compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        out = b"".join(compressor.compress(_ZEROS) for _ in range(size // _CHUNK))
        return codecs.GZIP, out + compressor.flush(), size
    if kind == "gzip-members":  # 48 members of 16 MiB each: every member is under the limit
        size = 48 * 16 * _CHUNK
        member = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        one = b"".join(member.compress(_ZEROS) for _ in range(16)) + member.flush()
        return codecs.GZIP, one * 48, size
    if kind == "snappy":  # raw snappy whose length varint says 1 GiB: decoders allocate it
        size = 1 << 30
        return codecs.SNAPPY, _varint(size) + b"\x00\x00", size
    if kind == "snappy-xerial":  # xerial framing, every block claiming 4 MiB
        size = 256 * 4 * _CHUNK
        block = _varint(4 * _CHUNK) + b"\x00\x00"
        out = codecs._XERIAL_HEADER + (struct.pack(">i", len(block)) + block) * 256
        return codecs.SNAPPY, out, size
    if kind == "lz4":  # 200 MiB of zeros (LZ4's ratio tops out near 255)
        size = 200 * _CHUNK
        compressor = lz4.frame.LZ4FrameCompressor(block_linked=False)  # as producers write
        out = compressor.begin() + b"".join(compressor.compress(_ZEROS)
                                            for _ in range(size // _CHUNK))
        return codecs.LZ4, out + compressor.flush(), size
    if kind in ("zstd", "zstd-pattern"):  # 1 GiB, no content size (as zstd-jni streams)
        size = 1 << 30
        data = _ZEROS if kind == "zstd" else _PATTERN
        compressor = zstandard.ZstdCompressor(level=3, write_content_size=False).compressobj()
        out = b"".join(compressor.compress(data) for _ in range(size // _CHUNK))
        return codecs.ZSTD, out + compressor.flush(), size
    raise ValueError(kind)


KINDS = ["gzip", "gzip-members", "snappy", "snappy-xerial", "lz4", "zstd", "zstd-pattern"]


def legit_batch(codec: int, base_timestamp: int, target: int = 900 * 1024) -> bytes:
    """A real batch about `target` bytes once compressed (under Kafka's default
    max.message.bytes): 1 KiB records of JSON-ish text with random numbers, which compress
    3-6x as real events do."""
    rng = random.Random(codec)
    words = [b"order", b"customer", b"amount", b"EUR", b"status", b"shipped", b"warehouse"]

    def value() -> bytes:
        out = bytearray()
        while len(out) < 1024:
            out += b'"%s": %d, ' % (rng.choice(words), rng.randrange(10**9))
        return bytes(out[:1024])

    def build(count: int) -> bytes:
        return records_batch([Record(i, 0, None, value()) for i in range(count)],
                             compression=codec, base_timestamp=base_timestamp)

    count = 1024
    count = int(count * target / len(build(count)))
    return build(count)

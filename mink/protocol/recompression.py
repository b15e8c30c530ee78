"""A topic's `compression.type` applied to a produced batch, as Kafka's LogValidator does.

`producer` (the default) keeps the batch as the client compressed it. Any codec other than
the batch's own (`uncompressed`, `gzip`, `snappy`, `lz4`, `zstd`) rebuilds the batch: the
same header and records, the records section compressed with the topic's codec (framed as
the Java producer frames it, `compression.compress`), the codec bits of the attributes,
the length and the CRC rewritten. A batch already in the topic's codec is stored as sent
(Kafka's in-place path). Compression levels (`compression.gzip.level` and the others) are
not applied: the codecs' defaults are used.
"""

from __future__ import annotations

import struct

from mink.protocol import compression as codecs
from mink.protocol.records import (
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_OFFSET,
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    decompressed_records,
    write_crc,
)

PRODUCER = "producer"
# compression.type values -> codec id (None: keep the producer's)
TOPIC_CODECS: dict[str, int | None] = {
    PRODUCER: None, "uncompressed": codecs.NONE, "gzip": codecs.GZIP,
    "snappy": codecs.SNAPPY, "lz4": codecs.LZ4, "zstd": codecs.ZSTD,
}
_CODEC_BITS = 0x07
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


def target_codec(compression_type: str | None) -> int | None:
    """The codec a topic's compression.type stores batches in; None keeps the producer's
    (also for a value stored before compression.type was validated)."""
    return TOPIC_CODECS.get(compression_type or PRODUCER)


def recompress(batch, source: int, target: int, section=None,
               max_decompressed_bytes: int | None = None) -> bytearray:
    """The batch with its records section in codec `target`. `section` is the decompressed
    records when the caller has them already (the validator does). Raises BatchError
    (records.py) when the records do not decompress."""
    if section is None:
        section = (memoryview(batch)[RECORD_BATCH_OVERHEAD:] if source == codecs.NONE else
                   decompressed_records(batch, max_decompressed_bytes))
    payload = codecs.compress(target, section)
    out = bytearray(RECORD_BATCH_OVERHEAD + len(payload))
    out[:RECORD_BATCH_OVERHEAD] = memoryview(batch)[:RECORD_BATCH_OVERHEAD]
    out[RECORD_BATCH_OVERHEAD:] = payload
    (attributes,) = _INT16.unpack_from(out, ATTRIBUTES_OFFSET)
    _INT16.pack_into(out, ATTRIBUTES_OFFSET, (attributes & ~_CODEC_BITS) | target)
    _INT32.pack_into(out, BATCH_LENGTH_OFFSET, len(out) - LOG_OVERHEAD)
    write_crc(out)
    return out

"""The consumers' own ways of reading a v2 batch, in-process, to check that whatever the
validator accepts every client reads, and reads alike.

- kafka-python's and aiokafka's record-batch readers, as they are (their codecs: kafka-python
  decodes zstd with python-zstandard's stream reader and snappy with python-snappy; aiokafka
  uses cramjam and checks the whole 16-byte xerial header).
- librdkafka's decompression, modelled where it differs from a plain decoder call: zstd is one
  `ZSTD_decompress` call over the whole payload (rdkafka_zstd.c, through the system's
  libzstd), snappy takes xerial framing only past 20 bytes with the 8-byte magic, refuses
  empty and trailing chunks and an empty result (rdkafka_msgset_reader.c, snappy-java
  framing); the raw snappy blocks go to cramjam, as librdkafka's decoder holds the same format.
  gzip is one inflate stream (rdgz.c): the first member only, whatever follows ignored; LZ4 is
  one frame, refused when bytes follow it (rdkafka_lz4.c).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import zlib

import cramjam
from aiokafka.record.default_records import DefaultRecordBatch as AiokafkaBatch
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch

Records = list[tuple[int, bytes | None, bytes | None, list]]


def kafka_python_records(batch: bytes) -> Records:
    reader = KafkaPythonBatch(batch)
    assert reader.validate_crc()
    return [(r.offset, r.key, r.value, list(r.headers)) for r in reader]


def aiokafka_records(batch: bytes) -> Records:
    reader = AiokafkaBatch(batch)
    assert reader.validate_crc()
    return [(r.offset, r.key, r.value, list(r.headers)) for r in reader]


_ZSTD_CONTENTSIZE_UNKNOWN = 2**64 - 1
_ZSTD_CONTENTSIZE_ERROR = 2**64 - 2
_ZSTD_ERROR_DST_SIZE_TOO_SMALL = 70
_RECEIVE_MESSAGE_MAX_BYTES = 100_000_000  # librdkafka's receive.message.max.bytes default


def _load_libzstd():
    name = ctypes.util.find_library("zstd")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    lib.ZSTD_getFrameContentSize.restype = ctypes.c_ulonglong
    lib.ZSTD_getFrameContentSize.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.ZSTD_decompress.restype = ctypes.c_size_t
    lib.ZSTD_decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p,
                                    ctypes.c_size_t]
    lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
    lib.ZSTD_getErrorCode.argtypes = [ctypes.c_size_t]
    lib.ZSTD_getErrorName.argtypes = [ctypes.c_size_t]
    lib.ZSTD_getErrorName.restype = ctypes.c_char_p
    return lib


_libzstd = _load_libzstd()
HAVE_LIBZSTD = _libzstd is not None


def librdkafka_zstd(payload: bytes) -> bytes:
    """rd_kafka_zstd_decompress: the first frame's content size (or twice the input) as the
    first guess, then ZSTD_decompress over everything, growing on dstSize_tooSmall."""
    size = _libzstd.ZSTD_getFrameContentSize(payload, len(payload))
    if size == _ZSTD_CONTENTSIZE_UNKNOWN:
        size = len(payload) * 2
    elif size == _ZSTD_CONTENTSIZE_ERROR:
        raise ValueError("librdkafka: not a zstd frame")
    while size <= _RECEIVE_MESSAGE_MAX_BYTES:
        out = ctypes.create_string_buffer(max(size, 1))
        ret = _libzstd.ZSTD_decompress(out, size, payload, len(payload))
        if not _libzstd.ZSTD_isError(ret):
            return out.raw[:ret]
        if _libzstd.ZSTD_getErrorCode(ret) != _ZSTD_ERROR_DST_SIZE_TOO_SMALL:
            raise ValueError(f"librdkafka: {_libzstd.ZSTD_getErrorName(ret).decode()}")
        size += max(size * 2, 4000)
    raise ValueError("librdkafka: over receive.message.max.bytes")


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def librdkafka_snappy(payload: bytes) -> bytes:
    if not (len(payload) > 20 and payload[:8] == _XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(payload))
    chunks, pos, out = payload[16:], 0, bytearray()
    while pos + 4 <= len(chunks):
        length = int.from_bytes(chunks[pos : pos + 4], "big")
        pos += 4
        if length > len(chunks) - pos:
            raise ValueError("librdkafka: invalid snappy-java chunk length")
        if length == 0:
            raise ValueError("librdkafka: failed to get the length of a snappy chunk")
        out += cramjam.snappy.decompress_raw(chunks[pos : pos + length])
        pos += length
    if pos != len(chunks):
        raise ValueError("librdkafka: trailing bytes in snappy-java framed data")
    if not out:
        raise ValueError("librdkafka: empty snappy-java framed data")
    return bytes(out)


def librdkafka_gzip(payload: bytes) -> bytes:
    inflater = zlib.decompressobj(15 + 32)
    out = inflater.decompress(payload)
    if not inflater.eof:
        raise ValueError("librdkafka: truncated gzip (it would return the part it has)")
    return out


def librdkafka_lz4(payload: bytes) -> bytes:
    import lz4.frame

    out, read = lz4.frame.decompress(payload, return_bytes_read=True)
    if read != len(payload):
        raise ValueError("librdkafka: bytes remaining after the LZ4 frame")
    return out

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of mink/protocol/record_walk.py (read its docstring): the same walk_records,
result for result. Built by `pip install -e .` (setup.py); without it the pure-Python one runs.
"""

from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

cdef enum:
    OFFSET_DELTA = 1
    MISSING_KEY = 2
    TIMESTAMP = 3

cdef enum:
    OK = 0
    EOF = 1
    LONG_VARINT = 2
    VARINT_RANGE = 3


cdef inline int read_varint(const unsigned char* buf, Py_ssize_t* pos, Py_ssize_t end,
                            int32_t* out) noexcept nogil:
    cdef uint32_t value = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if pos[0] >= end:
            return EOF
        b = buf[pos[0]]
        pos[0] += 1
        if b < 0x80:
            if shift == 28 and b > 0x0F:
                return VARINT_RANGE  # bits past 32: readers would disagree on the value
            value |= (<uint32_t>b) << shift
            out[0] = <int32_t>((value >> 1) ^ (-(<int32_t>(value & 1))))
            return OK
        value |= (<uint32_t>(b & 0x7F)) << shift
        shift += 7
        if shift > 28:
            return LONG_VARINT


cdef inline int read_varlong(const unsigned char* buf, Py_ssize_t* pos, Py_ssize_t end,
                             int64_t* out) noexcept nogil:
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if pos[0] >= end:
            return EOF
        b = buf[pos[0]]
        pos[0] += 1
        if b < 0x80:
            if shift == 63 and b > 0x01:
                return VARINT_RANGE  # bits past 64: readers would disagree on the value
            value |= (<uint64_t>b) << shift
            out[0] = <int64_t>((value >> 1) ^ (-(<int64_t>(value & 1))))
            return OK
        value |= (<uint64_t>(b & 0x7F)) << shift
        shift += 7
        if shift > 63:
            return LONG_VARINT


cdef inline bint ascii_only(const unsigned char* buf, Py_ssize_t start,
                           Py_ssize_t end) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(start, end):
        if buf[i] >= 0x80:
            return False
    return True


cdef str _varint_error(int status, str what):
    if status == EOF:
        return "premature end of the records"
    if status == VARINT_RANGE:
        return "varlong out of range" if what == "long" else "varint out of range"
    return "varlong is longer than 10 bytes" if what == "long" else "varint is longer than 5 bytes"


def walk_records(data, Py_ssize_t count, int64_t base_timestamp, int64_t timestamp_low,
                 int64_t timestamp_high, bint check_timestamps, bint require_key):
    cdef const unsigned char[::1] view = data
    cdef const unsigned char* buf = &view[0] if view.shape[0] else NULL
    cdef Py_ssize_t end = view.shape[0]
    cdef Py_ssize_t pos = 0, start, start_key, index = 0, h
    cdef int32_t size, offset_delta, key_length, length, header_count
    cdef int64_t timestamp_delta, timestamp, max_timestamp = -1
    cdef int status
    errors = []
    while index < count:
        status = read_varint(buf, &pos, end, &size)
        if status:
            return _varint_error(status, "int"), max_timestamp, errors
        if end - pos < size:
            return (f"invalid record size: expected {size} bytes in record {index}, but only "
                    f"{end - pos} remain"), max_timestamp, errors
        start = pos
        if pos >= end:
            return "premature end of the records", max_timestamp, errors
        if buf[pos] & 0x80:  # see record_walk.py: a varint to kafka-python and aiokafka
            return f"invalid attributes 0x{buf[pos]:02x} in record {index}", max_timestamp, errors
        pos += 1
        status = read_varlong(buf, &pos, end, &timestamp_delta)
        if status:
            return _varint_error(status, "long"), max_timestamp, errors
        status = read_varint(buf, &pos, end, &offset_delta)
        if status:
            return _varint_error(status, "int"), max_timestamp, errors
        status = read_varint(buf, &pos, end, &key_length)
        if status:
            return _varint_error(status, "int"), max_timestamp, errors
        if key_length >= 0:
            pos += key_length
            if pos > end:
                return (f"key of {key_length} bytes runs past the end of the records",
                        max_timestamp, errors)
        elif key_length != -1:
            return f"invalid key length {key_length}", max_timestamp, errors
        status = read_varint(buf, &pos, end, &length)
        if status:
            return _varint_error(status, "int"), max_timestamp, errors
        if length >= 0:
            pos += length
            if pos > end:
                return (f"value of {length} bytes runs past the end of the records",
                        max_timestamp, errors)
        elif length != -1:
            return f"invalid value length {length}", max_timestamp, errors
        status = read_varint(buf, &pos, end, &header_count)
        if status:
            return _varint_error(status, "int"), max_timestamp, errors
        if header_count < 0:
            return f"invalid number of record headers {header_count}", max_timestamp, errors
        if header_count > end - pos:
            return (f"invalid number of record headers {header_count}: more than the bytes "
                    "left"), max_timestamp, errors
        for h in range(header_count):
            status = read_varint(buf, &pos, end, &length)
            if status:
                return _varint_error(status, "int"), max_timestamp, errors
            if length < 0:
                return "invalid negative header key size", max_timestamp, errors
            start_key = pos
            pos += length
            if pos > end:
                return "header key runs past the end of the records", max_timestamp, errors
            if not ascii_only(buf, start_key, pos):
                try:
                    PyUnicode_DecodeUTF8(<const char*>buf + start_key, length, NULL)
                except UnicodeDecodeError:
                    return (f"a header key of record {index} is not UTF-8", max_timestamp,
                            errors)
            status = read_varint(buf, &pos, end, &length)
            if status:
                return _varint_error(status, "int"), max_timestamp, errors
            if length >= 0:
                pos += length
                if pos > end:
                    return (f"header value of {length} bytes runs past the end of the records",
                            max_timestamp, errors)
            elif length != -1:
                return f"invalid header value length {length}", max_timestamp, errors
        if pos - start != size:
            return (f"invalid record size: record {index} says {size} bytes, its fields take "
                    f"{pos - start}"), max_timestamp, errors
        timestamp = <int64_t>(<uint64_t>base_timestamp + <uint64_t>timestamp_delta)
        if timestamp > max_timestamp:
            max_timestamp = timestamp
        if offset_delta != index:
            errors.append((index, OFFSET_DELTA, offset_delta))
        elif require_key and key_length < 0:
            errors.append((index, MISSING_KEY, 0))
        elif (check_timestamps and timestamp != -1
              and not (timestamp_low <= timestamp <= timestamp_high)):
            errors.append((index, TIMESTAMP, timestamp))
        index += 1
    if pos != end:
        return (f"incorrect declared batch size: {end - pos} bytes remain after {count} records",
                max_timestamp, errors)
    return None, max_timestamp, errors

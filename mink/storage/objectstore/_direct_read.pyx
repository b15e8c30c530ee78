# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Direct (O_DIRECT) reads into memory that is used again, handed out without a copy.

read_direct(fd, start, stop) reads bytes [start, stop) of a file opened with O_DIRECT into
aligned memory of its own and returns a read-only memoryview of exactly those bytes. The
memory goes back to a small pool when the last view of it is gone (the view holds the
exporting object, which gives its memory back when it is freed), so a block cache that
reads a MiB, keeps it, and later drops it, reads the next MiB into memory already touched:
no copy out of a reused buffer, and no fresh pages for the kernel to fault in and zero.
On this project's VM that was 30% of a catch-up node's CPU (file.py's `get_view`).

Built by `pip install -e .` (setup.py); without it file.py reads into a reused buffer and
copies out once.
"""

import os

from cpython.buffer cimport PyBuffer_FillInfo
from libc.errno cimport EINTR, errno
from libc.stdint cimport uintptr_t
from libc.stdlib cimport free


cdef extern from "stdlib.h" nogil:
    int posix_memalign(void** memptr, size_t alignment, size_t size)

cdef extern from "unistd.h" nogil:
    ssize_t pread(int fd, void* buf, size_t count, long long offset)


ALIGN = 4096  # O_DIRECT's alignment of memory, file offset and length
# Memory comes in sizes of whole steps (at most a step's waste on a block cache's MiB),
# and at most IDLE_LIMIT of it waits in the pool for a read.
STEP = 64 * 1024
IDLE_LIMIT = 32 * 1024 * 1024

cdef Py_ssize_t _align = ALIGN
cdef Py_ssize_t _step = STEP
cdef Py_ssize_t _idle_limit = IDLE_LIMIT
cdef dict _free = {}  # size -> [addresses of idle memory of that size]
cdef Py_ssize_t _idle = 0
cdef Py_ssize_t _allocated = 0  # memory allocated afresh, ever (for tests)


cdef inline Py_ssize_t _round_up(Py_ssize_t n, Py_ssize_t to):
    return (n + to - 1) // to * to


cdef char* _take(Py_ssize_t size) except NULL:
    global _idle
    cdef list idle = _free.get(size)
    cdef void* memory = NULL
    if idle:
        _idle -= size
        return <char*><uintptr_t>idle.pop()
    if posix_memalign(&memory, _align, size) != 0:
        raise MemoryError(f"no {size} bytes of aligned memory")
    global _allocated
    _allocated += 1
    return <char*>memory


cdef void _give(char* memory, Py_ssize_t size) noexcept:
    """Memory back to the pool, room made by freeing idle memory of other sizes; freed
    itself if it is larger than the pool. Runs with the GIL held (from a dealloc)."""
    global _idle
    cdef list idle
    cdef Py_ssize_t other
    cdef bint freed = True
    if size > _idle_limit or _free is None:  # (None: the module torn down at exit)
        free(memory)
        return
    while freed and _idle + size > _idle_limit:
        freed = False
        for other, idle in _free.items():
            if idle:
                free(<void*><uintptr_t>idle.pop())
                _idle -= other
                freed = True
                break
    _free.setdefault(size, []).append(<uintptr_t>memory)
    _idle += size


def idle_bytes() -> int:
    """How much memory waits in the pool (for tests)."""
    return _idle


def allocations() -> int:
    """How many times memory was allocated afresh, not taken from the pool (for tests)."""
    return _allocated


cdef class DirectBlock:
    """Bytes read with O_DIRECT, exported read-only; its memory goes back to the pool when
    the block is freed (no view of it is left)."""
    cdef char* memory
    cdef Py_ssize_t size  # of the memory
    cdef Py_ssize_t skip  # where the bytes begin in it
    cdef Py_ssize_t length

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        PyBuffer_FillInfo(buffer, self, self.memory + self.skip, self.length, 1, flags)

    def __releasebuffer__(self, Py_buffer* buffer):
        pass

    def __dealloc__(self):
        if self.memory != NULL:
            _give(self.memory, self.size)
            self.memory = NULL


def read_direct(int fd, long long start, long long stop) -> memoryview:
    """Bytes [start, stop) of a file opened with O_DIRECT as a read-only memoryview; fewer
    only where the file ends first. OSError as the read raised it."""
    cdef long long aligned = start - start % _align
    cdef Py_ssize_t want = _round_up(<Py_ssize_t>(stop - aligned), _align)
    cdef Py_ssize_t size = _round_up(want, _step)
    cdef char* memory = _take(size)
    cdef Py_ssize_t got = 0
    cdef ssize_t n = 0
    cdef int error = 0
    with nogil:
        while got < want:
            n = pread(fd, memory + got, want - got, aligned + got)
            if n < 0:
                if errno == EINTR:
                    continue
                error = errno
                break
            if n == 0:  # an O_DIRECT read is short only at the end of the file
                break
            got += n
    if error:
        _give(memory, size)
        raise OSError(error, os.strerror(error))
    cdef DirectBlock block = DirectBlock.__new__(DirectBlock)
    block.memory = memory
    block.size = size
    block.skip = <Py_ssize_t>(start - aligned)
    block.length = max(0, min(got, <Py_ssize_t>(stop - aligned)) - block.skip)
    return memoryview(block)

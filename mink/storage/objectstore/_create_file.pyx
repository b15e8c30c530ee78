# cython: language_level=3, boundscheck=False, wraparound=False
"""A small object's create (a WAL object) in one call that holds no GIL: the temporary file
opened, written, fdatasynced and closed, linked to its name (create-if-absent), unlinked,
and its directory fsynced.

In Python each of those syscalls gave the GIL up and took it back; the upload runs in a
worker thread beside the event loop, and with the loop busy (a node at 20 MB/s: about 80%)
each take-back waited for the loop's current step. A WAL object's create (113 KB) beside a
loop 80% busy in Python took 2.7-3.1 ms on average this way against 3.3-4.3 in Python
(benchmarks.gil_helpers); every produce request's commit waits for it.

create_file(tmp, path, parent, buffers, sync) -> (stage, errno): (CREATED, 0) when the
object is there; otherwise the stage that failed (OPEN: nothing was made; WRITE: the
write, fdatasync or close; LINK: link(tmp, path), EEXIST if the name is taken; UNLINK: the
object is there but the temporary name stayed; SYNC_DIR: the object is there, its name not
known to be durable) and its errno; where the object was not made, nor is the temporary
file left. `sync` False: no fdatasync and no directory fsync (tests and benchmarks).

Built by `pip install -e .` (setup.py); without it file.py makes the same calls in Python.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.errno cimport EINTR, ENOENT, errno
from libc.stdlib cimport free, malloc
from posix.fcntl cimport O_CLOEXEC, O_CREAT, O_DIRECTORY, O_EXCL, O_RDONLY, O_WRONLY
from posix.fcntl cimport open as c_open
from posix.uio cimport iovec, writev
from posix.unistd cimport close, fdatasync, fsync, link, unlink

cpdef enum:  # create_file's outcome: the stage that failed
    CREATED = 0
    OPEN = 1
    WRITE = 2
    LINK = 3
    UNLINK = 4
    SYNC_DIR = 5

cdef enum:
    IOV_MAX = 1024  # iovecs per writev (Linux's UIO_MAXIOV)


cdef int _write_all(int fd, iovec* iov, Py_ssize_t count) noexcept nogil:
    """Every byte of iov[0:count] written; 0 or an errno. Advances the iovecs it wrote."""
    cdef Py_ssize_t i = 0
    cdef Py_ssize_t n
    cdef Py_ssize_t written
    while i < count:
        if iov[i].iov_len == 0:
            i += 1
            continue
        n = count - i
        if n > IOV_MAX:
            n = IOV_MAX
        written = writev(fd, &iov[i], <int>n)
        if written < 0:
            if errno == EINTR:
                continue
            return errno
        while written > 0:
            if <size_t>written >= iov[i].iov_len:
                written -= iov[i].iov_len
                iov[i].iov_len = 0
                i += 1
            else:
                iov[i].iov_base = <char*>iov[i].iov_base + written
                iov[i].iov_len -= written
                written = 0
    return 0


cdef int _create(const char* tmp, const char* path, const char* parent, iovec* iov,
                 Py_ssize_t count, bint sync, int* error) noexcept nogil:
    cdef int fd = c_open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o666)
    cdef int err
    if fd < 0:
        error[0] = errno
        return OPEN
    err = _write_all(fd, iov, count)
    if err == 0 and sync and fdatasync(fd) != 0:
        err = errno
    if close(fd) != 0 and err == 0:
        err = errno
    if err != 0:
        unlink(tmp)
        error[0] = err
        return WRITE
    if link(tmp, path) != 0:
        error[0] = errno
        unlink(tmp)
        return LINK
    if unlink(tmp) != 0 and errno != ENOENT:
        error[0] = errno
        return UNLINK
    if sync:
        fd = c_open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if fd < 0:
            error[0] = errno
            return SYNC_DIR
        err = fsync(fd)
        if err != 0:
            err = errno
        close(fd)
        if err != 0:
            error[0] = err
            return SYNC_DIR
    return CREATED


def create_file(bytes tmp, bytes path, bytes parent, list buffers, bint sync):
    cdef Py_ssize_t count = len(buffers)
    cdef Py_buffer* views = <Py_buffer*>malloc(max(count, 1) * sizeof(Py_buffer))
    cdef iovec* iov = <iovec*>malloc(max(count, 1) * sizeof(iovec))
    cdef Py_ssize_t held = 0
    cdef const char* c_tmp = tmp
    cdef const char* c_path = path
    cdef const char* c_parent = parent
    cdef int stage
    cdef int error = 0
    if views == NULL or iov == NULL:
        free(views)
        free(iov)
        raise MemoryError()
    try:
        for held in range(count):
            PyObject_GetBuffer(buffers[held], &views[held], PyBUF_SIMPLE)
            iov[held].iov_base = views[held].buf
            iov[held].iov_len = views[held].len
        held = count
        with nogil:
            stage = _create(c_tmp, c_path, c_parent, iov, count, sync, &error)
        return stage, error
    finally:
        for i in range(held):
            PyBuffer_Release(&views[i])
        free(views)
        free(iov)

# cython: language_level=3, boundscheck=False, wraparound=False
"""A small object's create (a WAL object) in a thread of its own that never takes the GIL:
the temporary file opened, written, fdatasynced and closed, linked to its name
(create-if-absent), unlinked, and its directory fsynced; its end signalled on an eventfd,
which the event loop waits on like a socket.

In Python each of those syscalls gave the GIL up and took it back; the upload ran in a
worker thread beside the event loop, and with the loop busy (a node at 20 MB/s: about 80%)
each take-back waited for the loop's current step. One compiled call in trio's worker thread
still took the GIL twice, to start and to return (a WAL object's create beside a busy loop:
2.7-3.1 ms on average against 3.3-4.3 in Python, benchmarks.gil_helpers). A thread that
never takes it leaves only the loop's wake-up on the eventfd (1.6-2.7 ms against 2.4-3.5 in
trio's worker thread, the same benchmark's busy loop, alternated).

CreateJob(tmp, path, parent, buffers, sync) starts the thread; once `fileno` is readable,
`result()` -> (stage, errno): (CREATED, 0) when the object is there; otherwise the stage
that failed (OPEN: nothing was made; WRITE: the write, fdatasync or close; LINK: link(tmp,
path), EEXIST if the name is taken; UNLINK: the object is there but the temporary name
stayed; SYNC_DIR: the object is there, its name not known to be durable) and its errno;
where the object was not made, nor is the temporary file left. `sync` False: no fdatasync
and no directory fsync (tests and benchmarks).

Built by `pip install -e .` (setup.py); without it file.py makes the same calls in Python,
in trio's worker thread.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.errno cimport EINTR, ENOENT, errno
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport strerror
from posix.fcntl cimport O_CLOEXEC, O_CREAT, O_DIRECTORY, O_EXCL, O_RDONLY, O_WRONLY
from posix.fcntl cimport open as c_open
from posix.uio cimport iovec, writev
from posix.unistd cimport close, fdatasync, fsync, link, unlink, write

cpdef enum:  # a create's outcome: the stage that failed
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


cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_t:
        pass
    int pthread_create(pthread_t* thread, const void* attr, void* (*start)(void*) noexcept nogil,
                       void* arg)
    int pthread_join(pthread_t thread, void** result)

cdef extern from "<signal.h>" nogil:
    ctypedef struct sigset_t:
        pass
    int sigfillset(sigset_t* mask)
    int pthread_sigmask(int how, const sigset_t* mask, sigset_t* old)
    int SIG_BLOCK
    int SIG_SETMASK

cdef extern from "<sys/eventfd.h>" nogil:
    int eventfd(unsigned int initval, int flags)
    int EFD_CLOEXEC
    int EFD_NONBLOCK


cdef struct _Job:
    const char* tmp
    const char* path
    const char* parent
    iovec* iov
    Py_ssize_t count
    bint sync
    int stage
    int error
    int done_fd


cdef void* _run_job(void* arg) noexcept nogil:
    cdef _Job* job = <_Job*>arg
    cdef uint64_t one = 1
    job.stage = _create(job.tmp, job.path, job.parent, job.iov, job.count, job.sync, &job.error)
    write(job.done_fd, &one, sizeof(one))  # an eventfd: 8 bytes, never blocks at 1
    return NULL


cdef class CreateJob:
    """One create, its thread started at once (see the module's docstring). The buffers are
    held until the thread ended: `close()`, or the job's collection, waits for it (without
    the GIL) before it lets them and the eventfd go."""

    cdef _Job job
    cdef bytes _tmp, _path, _parent
    cdef Py_buffer* views
    cdef Py_ssize_t held
    cdef pthread_t thread
    cdef bint started

    def __cinit__(self, bytes tmp, bytes path, bytes parent, list buffers, bint sync):
        cdef Py_ssize_t count = len(buffers)
        cdef sigset_t all_signals, previous
        cdef int err
        self.job.done_fd = -1
        self.views = <Py_buffer*>malloc(max(count, 1) * sizeof(Py_buffer))
        self.job.iov = <iovec*>malloc(max(count, 1) * sizeof(iovec))
        if self.views == NULL or self.job.iov == NULL:
            raise MemoryError()
        for self.held in range(count):
            PyObject_GetBuffer(buffers[self.held], &self.views[self.held], PyBUF_SIMPLE)
            self.job.iov[self.held].iov_base = self.views[self.held].buf
            self.job.iov[self.held].iov_len = self.views[self.held].len
        self.held = count
        self._tmp, self._path, self._parent = tmp, path, parent
        self.job.tmp, self.job.path, self.job.parent = tmp, path, parent
        self.job.count = count
        self.job.sync = sync
        self.job.done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)
        if self.job.done_fd < 0:
            raise OSError(errno, strerror(errno).decode())
        # No signal for this thread: the interpreter's handlers run in the main thread.
        sigfillset(&all_signals)
        pthread_sigmask(SIG_BLOCK, &all_signals, &previous)
        err = pthread_create(&self.thread, NULL, _run_job, &self.job)
        pthread_sigmask(SIG_SETMASK, &previous, NULL)
        if err != 0:
            raise OSError(err, strerror(err).decode())
        self.started = True

    @property
    def fileno(self) -> int:
        return self.job.done_fd

    def result(self):
        """(stage, errno); waits for the thread if it still runs."""
        self._join()
        return self.job.stage, self.job.error

    def close(self):
        """Waits for the thread if it runs, then lets the buffers and the eventfd go."""
        self._join()
        self._release()

    cdef void _join(self) noexcept:
        if self.started:
            with nogil:
                pthread_join(self.thread, NULL)
            self.started = False

    cdef void _release(self) noexcept:
        cdef Py_ssize_t i
        if self.views != NULL:
            for i in range(self.held):
                PyBuffer_Release(&self.views[i])
            free(self.views)
            self.views = NULL
        if self.job.iov != NULL:
            free(self.job.iov)
            self.job.iov = NULL
        if self.job.done_fd >= 0:
            close(self.job.done_fd)
            self.job.done_fd = -1

    def __dealloc__(self):
        self._join()
        self._release()

# cython: language_level=3, boundscheck=False, wraparound=False
"""A small object's create (a WAL object) in threads of this helper's own that never take
the GIL: the temporary file opened, written, fdatasynced and closed, linked to its name
(create-if-absent), unlinked, and its directory fsynced; its end signalled on an eventfd,
which the event loop waits on like a socket.

In Python each of those syscalls gave the GIL up and took it back; the upload ran in a
worker thread beside the event loop, and with the loop busy (a node at 20 MB/s: about 80%)
each take-back waited for the loop's current step. One compiled call in trio's worker thread
still took the GIL twice, to start and to return (a WAL object's create beside a busy loop:
2.7-3.1 ms on average against 3.3-4.3 in Python, benchmarks.gil_helpers). A thread that
never takes it leaves only the loop's wake-up on the eventfd (1.6-2.7 ms against 2.4-3.5 in
trio's worker thread, the same benchmark's busy loop, alternated).

CreateJob(tmp, path, parent, buffers, sync) queues the create for those threads (at most
WORKERS_AT_MOST, started as creates need them and parked between them); once `fileno` is readable,
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

from mink.storage._threads cimport (
    pthread_atfork,
    pthread_cond_init,
    pthread_cond_signal,
    pthread_cond_t,
    pthread_cond_wait,
    pthread_mutex_init,
    pthread_mutex_lock,
    pthread_mutex_t,
    pthread_mutex_unlock,
    start_detached,
)

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


cdef extern from "<sys/eventfd.h>" nogil:
    int eventfd(unsigned int initval, int flags)
    int EFD_CLOEXEC
    int EFD_NONBLOCK

cdef extern from "<poll.h>" nogil:
    cdef struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd* fds, unsigned long nfds, int timeout)
    short POLLIN


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
    _Job* next


# The creates' threads: started as jobs need them, at most MAX_WORKERS, parked on a
# condition variable between jobs for the process's lifetime (a thread started per job
# cost the event loop 80 us a create under load). Their signals are blocked: the
# interpreter's handlers run in the main thread.
cdef enum:
    MAX_WORKERS = 4

cdef pthread_mutex_t _lock
cdef pthread_cond_t _wake
cdef _Job* _head = NULL
cdef _Job* _tail = NULL
cdef int _queued = 0
cdef int _waiting = 0
cdef int _workers = 0
WORKERS_AT_MOST = MAX_WORKERS


cdef void* _work(void* arg) noexcept nogil:
    global _head, _tail, _queued, _waiting
    cdef _Job* job
    cdef int done_fd
    cdef uint64_t one = 1
    while True:
        pthread_mutex_lock(&_lock)
        while _head == NULL:
            _waiting += 1
            pthread_cond_wait(&_wake, &_lock)
            _waiting -= 1
        job = _head
        _head = job.next
        if _head == NULL:
            _tail = NULL
        _queued -= 1
        pthread_mutex_unlock(&_lock)
        job.stage = _create(job.tmp, job.path, job.parent, job.iov, job.count, job.sync,
                            &job.error)
        done_fd = job.done_fd
        # The last touch of the job: its owner may let it go once the eventfd is readable.
        write(done_fd, &one, sizeof(one))  # an eventfd: 8 bytes, never blocks at 1
    return NULL


cdef int _submit(_Job* job) noexcept nogil:
    """Queues the job, waking a parked thread or starting one; 0, or the errno of a thread
    that could not be started when there is none to run it (then it is not queued)."""
    global _head, _tail, _queued, _workers
    cdef int err = 0
    pthread_mutex_lock(&_lock)
    job.next = NULL
    if _tail == NULL:
        _head = job
    else:
        _tail.next = job
    _tail = job
    _queued += 1
    if _waiting >= _queued:
        pthread_cond_signal(&_wake)
    elif _workers < MAX_WORKERS:
        err = start_detached(_work, NULL)
        if err == 0:
            _workers += 1
        elif _workers > 0:
            err = 0  # a running thread takes it in turn
        else:  # nobody to run it: take it back (it is the only one queued)
            _head = _tail = NULL
            _queued = 0
    pthread_mutex_unlock(&_lock)
    return err


cdef void _forget_workers() noexcept nogil:
    """In a forked child: the threads were not copied, and the lock may have been held."""
    global _head, _tail, _queued, _waiting, _workers
    pthread_mutex_init(&_lock, NULL)
    pthread_cond_init(&_wake, NULL)
    _head = _tail = NULL
    _queued = _waiting = _workers = 0


pthread_mutex_init(&_lock, NULL)
pthread_cond_init(&_wake, NULL)
pthread_atfork(NULL, NULL, _forget_workers)


cdef class CreateJob:
    """One create, queued for the creates' threads at once (see the module's docstring).
    The buffers are held until its thread is done with it: `close()`, or the job's
    collection, waits for that (without the GIL) before it lets them and the eventfd go."""

    cdef _Job job
    cdef bytes _tmp, _path, _parent
    cdef Py_buffer* views
    cdef Py_ssize_t held
    cdef bint submitted

    def __cinit__(self, bytes tmp, bytes path, bytes parent, list buffers, bint sync):
        cdef Py_ssize_t count = len(buffers)
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
        err = _submit(&self.job)
        if err != 0:
            raise OSError(err, strerror(err).decode())
        self.submitted = True

    @property
    def fileno(self) -> int:
        return self.job.done_fd

    def result(self):
        """(stage, errno); waits for the job's thread if it is not done with it yet."""
        self._wait()
        return self.job.stage, self.job.error

    def close(self):
        """Waits for the job's thread if it is not done with it yet, then lets the buffers
        and the eventfd go."""
        self._wait()
        self._release()

    cdef void _wait(self) noexcept:
        cdef pollfd ready
        if not self.submitted:
            return
        ready.fd = self.job.done_fd
        ready.events = POLLIN
        with nogil:
            while poll(&ready, 1, -1) != 1:
                pass
        self.submitted = False

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
        self._wait()
        self._release()

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""compose's copy of other objects' byte ranges into a direct (O_DIRECT) output, a step at a
time, with the GIL released for the whole step.

Tiering composes a stream object from thousands of WAL ranges (a 32 MiB object of 4 KiB
batches: about 8,000, from a couple of thousand WAL objects). Copied in Python, the worker
thread ran Python between each range's few syscalls and took the GIL back after each of
them, beside the event loop; here a step (every range up to the next MiB written: opening
their objects, reading them, filling the aligned buffer and writing it) is one call that
holds no GIL, and Python runs once per MiB, to pace the copy. Such a compose took 31-59 ms
of CPU against 60-90 (benchmarks.gil_helpers). It did not change what a leader's commits
feel while a round copies (benchmarks/results/tiering-commit-latency-gil-20261207.md).

RangeCopier(dst, stage, fill, offset, window, paths, which, starts, ends, o_direct,
direct_above):
- `dst` an output file opened with O_DIRECT, written at `offset` from `stage` (aligned,
  a whole number of blocks, its first `fill` bytes already taken) each time the stage
  fills; `window` (aligned) the buffer ranges are read into;
- range i is bytes [starts[i], ends[i]) of the object at paths[which[i]] (fs-encoded bytes),
  each object opened once, read with O_DIRECT (flag `o_direct`) if it is `direct_above`
  bytes or larger (it was written so), through the page cache otherwise;
- step() copies until the stage was written (FLUSHED) or every range is in it (DONE), or
  stops at range `index` with NOT_FOUND, SHORT (the object ends before the range does) or
  OS_ERROR (`error` the errno). `fill` and `offset` say where the stage stands.
close() closes the objects and lets the buffers go.

Built by `pip install -e .` (setup.py); without it file.py copies the ranges in Python.
"""

from libc.errno cimport EINTR, EISDIR, ENOENT, ENOTDIR, errno
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from posix.fcntl cimport F_GETFL, F_SETFL, O_CLOEXEC, O_RDONLY, fcntl, open as c_open
from posix.stat cimport S_ISDIR, fstat, struct_stat
from posix.unistd cimport close, pread, pwrite

cpdef enum:  # step()'s outcomes
    DONE = 0
    FLUSHED = 1
    NOT_FOUND = 2
    SHORT = 3
    OS_ERROR = 4

cdef enum:
    ALIGN = 4096  # O_DIRECT's alignment of memory, file offset and length

# objects opened, by how they were read (for tests)
cdef Py_ssize_t _opened_direct = 0
cdef Py_ssize_t _opened_cached = 0


def opened() -> tuple[int, int]:
    """(objects opened with O_DIRECT, through the page cache) since the module was loaded."""
    return _opened_direct, _opened_cached


cdef class RangeCopier:
    cdef int dst
    cdef unsigned char[::1] stage
    cdef unsigned char[::1] window
    cdef list paths  # keeps the bytes behind `names` alive
    cdef const char** names
    cdef int* fds
    cdef Py_ssize_t npaths
    cdef const long long[::1] which
    cdef const long long[::1] starts
    cdef const long long[::1] ends
    cdef int o_direct
    cdef long long direct_above
    cdef long long position  # in range `index`
    cdef long long carry_at  # bytes of the window read but not yet in the stage
    cdef long long carried
    cdef readonly Py_ssize_t index
    cdef readonly Py_ssize_t fill
    cdef readonly long long offset
    cdef readonly int error

    def __cinit__(self, int dst, unsigned char[::1] stage, Py_ssize_t fill, long long offset,
                  unsigned char[::1] window, list paths, const long long[::1] which,
                  const long long[::1] starts, const long long[::1] ends, int o_direct,
                  long long direct_above):
        cdef Py_ssize_t i
        if not (len(which) == len(starts) == len(ends)):
            raise ValueError("which, starts and ends differ in length")
        if stage.shape[0] == 0 or stage.shape[0] % ALIGN or window.shape[0] < 2 * ALIGN:
            raise ValueError("the stage must be whole blocks, the window two blocks or more")
        if not 0 <= fill < stage.shape[0]:
            raise ValueError(f"fill {fill} outside the stage")
        for i in range(len(which)):
            if not (0 <= which[i] < len(paths)) or not 0 <= starts[i] <= ends[i]:
                raise ValueError(f"range {i} is not a range of one of the paths")
        self.dst = dst
        self.stage = stage
        self.window = window
        self.fill = fill
        self.offset = offset
        self.paths = [bytes(p) for p in paths]
        self.npaths = len(self.paths)
        self.names = <const char**>malloc(max(self.npaths, 1) * sizeof(char*))
        self.fds = <int*>malloc(max(self.npaths, 1) * sizeof(int))
        if self.names == NULL or self.fds == NULL:
            raise MemoryError()
        for i in range(self.npaths):
            self.names[i] = <const char*>(<bytes>self.paths[i])
            self.fds[i] = -1
        self.which = which
        self.starts = starts
        self.ends = ends
        self.o_direct = o_direct
        self.direct_above = direct_above
        self.index = 0
        self.position = starts[0] if len(starts) else 0
        self.error = 0
        self.carried = 0

    def __dealloc__(self):
        self._close_all()
        free(self.names)
        free(self.fds)

    cdef void _close_all(self) noexcept:
        cdef Py_ssize_t i
        if self.fds != NULL:
            for i in range(self.npaths):
                if self.fds[i] >= 0:
                    close(self.fds[i])
                    self.fds[i] = -1

    def close(self) -> None:
        self._close_all()
        self.stage = None
        self.window = None

    def step(self) -> int:
        if self.stage is None:
            raise ValueError("the copier is closed")
        cdef int status
        with nogil:
            status = self._step()
        return status

    cdef int _open(self, Py_ssize_t p) noexcept nogil:
        """The descriptor of object p, opened now if it is not yet; -1 with `error` set."""
        global _opened_direct, _opened_cached
        cdef int fd = self.fds[p]
        cdef struct_stat st
        if fd >= 0:
            return fd
        fd = c_open(self.names[p], O_RDONLY | O_CLOEXEC)
        if fd < 0:
            self.error = errno
            return -1
        if fstat(fd, &st) != 0:
            self.error = errno
            close(fd)
            return -1
        if S_ISDIR(st.st_mode):
            self.error = EISDIR
            close(fd)
            return -1
        if self.o_direct and st.st_size >= self.direct_above:
            if fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | self.o_direct) != 0:
                self.error = errno
                close(fd)
                return -1
            _opened_direct += 1
        else:
            _opened_cached += 1
        self.fds[p] = fd
        return fd

    cdef int _flush(self) noexcept nogil:
        """The full stage written at `offset`; OS_ERROR or FLUSHED."""
        cdef Py_ssize_t size = self.stage.shape[0]
        cdef Py_ssize_t done = 0
        cdef Py_ssize_t n
        while done < size:
            n = pwrite(self.dst, &self.stage[done], size - done, self.offset + done)
            if n < 0:
                if errno == EINTR:
                    continue
                self.error = errno
                return OS_ERROR
            done += n
        self.offset += size
        self.fill = 0
        return FLUSHED

    cdef int _append(self, long long at, long long count) noexcept nogil:
        """window[at:at + count] (the range's next bytes) into the stage; where it fills, the
        stage is written and what is left of them waits in the window for the next step."""
        cdef Py_ssize_t n
        while count > 0:
            n = count
            if n > self.stage.shape[0] - self.fill:
                n = self.stage.shape[0] - self.fill
            memcpy(&self.stage[self.fill], &self.window[at], n)
            self.fill += n
            self.position += n
            at += n
            count -= n
            if self.fill == self.stage.shape[0]:
                self.carry_at = at
                self.carried = count
                return self._flush()
        self.carried = 0
        return DONE

    cdef int _step(self) noexcept nogil:
        cdef Py_ssize_t total = self.which.shape[0]
        cdef long long end, aligned, skip, want, got
        cdef int fd, status
        if self.carried > 0:
            status = self._append(self.carry_at, self.carried)
            if status != DONE:
                return status
        while self.index < total:
            fd = self._open(self.which[self.index])
            if fd < 0:
                if self.error == ENOENT or self.error == ENOTDIR or self.error == EISDIR:
                    return NOT_FOUND
                return OS_ERROR
            end = self.ends[self.index]
            while self.position < end:
                aligned = self.position - self.position % ALIGN
                skip = self.position - aligned
                want = (end - aligned + ALIGN - 1) // ALIGN * ALIGN
                if want > self.window.shape[0]:
                    want = self.window.shape[0]
                # one read: an O_DIRECT read is short only at the end of the file
                got = pread(fd, &self.window[0], want, aligned)
                if got < 0:
                    if errno == EINTR:
                        continue
                    self.error = errno
                    return OS_ERROR
                got -= skip
                if got > end - self.position:
                    got = end - self.position
                if got <= 0:
                    return SHORT
                status = self._append(skip, got)
                if status != DONE:
                    return status
            self.index += 1
            if self.index < total:
                self.position = self.starts[self.index]
        return DONE

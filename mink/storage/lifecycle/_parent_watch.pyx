# cython: language_level=3
"""A thread that ends this process once its parent is gone, without the GIL: the tiering
child's watch (tiering_child_main.py). A Python thread needs the GIL to look, and the
child's main thread, at idle CPU priority, holds it between copy steps; with the cores busy
it is not scheduled and never lets it go, so a watch in Python waited as long as the cores
stayed busy (the node SIGKILLed, its child still copying seconds later).

exit_with_parent(parent, interval_ms): from now on, within `interval_ms` of `getppid()`
no longer being `parent`, `_exit(0)`. The thread is started at the caller's scheduling
policy: call it before lowering the process's priority. Raises OSError if it cannot start.
"""

from libc.string cimport strerror
from posix.types cimport pid_t
from posix.unistd cimport _exit, getppid, usleep

from mink.storage._threads cimport start_detached


cdef struct _Watch:
    pid_t parent
    unsigned int interval_us


cdef _Watch _watch


cdef void* _run(void* arg) noexcept nogil:
    while getppid() == _watch.parent:
        usleep(_watch.interval_us)
    _exit(0)


def exit_with_parent(int parent, int interval_ms=200):
    cdef int err
    _watch.parent = parent
    _watch.interval_us = interval_ms * 1000
    err = start_detached(_run, NULL)
    if err != 0:
        raise OSError(err, strerror(err).decode())

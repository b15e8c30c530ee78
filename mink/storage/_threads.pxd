# cython: language_level=3
# The pthread pieces mink's compiled helpers share (_create_file.pyx, _parent_watch.pyx):
# threads of their own that never take the GIL.

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_t:
        pass
    ctypedef struct pthread_attr_t:
        pass
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                       void* (*start)(void*) noexcept nogil, void* arg)
    int pthread_attr_init(pthread_attr_t* attr)
    int pthread_attr_setdetachstate(pthread_attr_t* attr, int state)
    int pthread_attr_destroy(pthread_attr_t* attr)
    int PTHREAD_CREATE_DETACHED
    int pthread_mutex_init(pthread_mutex_t* mutex, const void* attr)
    int pthread_mutex_lock(pthread_mutex_t* mutex)
    int pthread_mutex_unlock(pthread_mutex_t* mutex)
    int pthread_cond_init(pthread_cond_t* cond, const void* attr)
    int pthread_cond_wait(pthread_cond_t* cond, pthread_mutex_t* mutex)
    int pthread_cond_signal(pthread_cond_t* cond)
    int pthread_atfork(void (*prepare)() noexcept nogil, void (*parent)() noexcept nogil,
                       void (*child)() noexcept nogil)

cdef extern from "<signal.h>" nogil:
    ctypedef struct sigset_t:
        pass
    int sigfillset(sigset_t* mask)
    int pthread_sigmask(int how, const sigset_t* mask, sigset_t* old)
    int SIG_BLOCK
    int SIG_SETMASK


cdef inline int start_detached(void* (*start)(void*) noexcept nogil, void* arg) noexcept nogil:
    """A detached thread running start(arg), every signal blocked in it (the interpreter's
    handlers run in the main thread); 0 or pthread_create's errno."""
    cdef pthread_t thread
    cdef pthread_attr_t attr
    cdef sigset_t all_signals, previous
    cdef int err
    pthread_attr_init(&attr)
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED)
    sigfillset(&all_signals)
    pthread_sigmask(SIG_BLOCK, &all_signals, &previous)
    err = pthread_create(&thread, &attr, start, arg)
    pthread_sigmask(SIG_SETMASK, &previous, NULL)
    pthread_attr_destroy(&attr)
    return err

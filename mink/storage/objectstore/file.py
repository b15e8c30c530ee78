"""file:///abs/path — objects as files under a folder (one node, or a shared POSIX filesystem).

create: the bytes go to a temporary file in the object's directory, are fsynced, and the
object appears atomically and only if absent with `link(tmp, final)` (EEXIST: ObjectExists);
then the temporary name is removed and the directory fsynced. A crash leaves at most a
`.mink-tmp-*` file behind, never a partial object. Directories are created as needed and
never removed (there are few: one per node epoch for the WAL).

Where the filesystem takes O_DIRECT, objects of 256 KiB or more are written, and ranges of
64 KiB or more read, around the page cache (see DIRECT_ALIGN); elsewhere, or with
`direct=False`, through it.

Every operation is one hop to a worker thread (`trio.to_thread.run_sync`), not one per syscall;
a small object's create, where the compiled helper was built, a thread of the helper's own
that never takes the GIL (`_create_file.pyx`).
Names starting with `.mink-` are reserved for these temporary files and are never listed.
On a filesystem, a key cannot also be a "directory" of another key ("a" and "a/b").
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import logging
import mmap
import os
import secrets
import stat
import threading
from array import array
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import trio

from .base import (
    WAL_PREFIX,
    Buffer,
    Data,
    ObjectExists,
    ObjectNotFound,
    ObjectRange,
    ObjectStoreConfigError,
    ObjectStoreError,
    ObjectStoreUnavailable,
    as_buffers,
    check_key,
    check_range,
)

try:  # the compiled helper (setup.py); without it, direct reads copy out of a reused buffer
    from ._direct_read import read_direct as _read_direct_view
except ImportError:  # pragma: no cover - depends on the build
    _read_direct_view = None
try:  # the compiled helper (setup.py); without it, a direct compose copies in Python
    from . import _range_copy
except ImportError:  # pragma: no cover - depends on the build
    _range_copy = None
try:  # the compiled helper (setup.py); without it, a small create's syscalls are Python's
    from . import _create_file
except ImportError:  # pragma: no cover - depends on the build
    _create_file = None

log = logging.getLogger(__name__)
T = TypeVar("T")
# scan's reader: (key, position, buffer) -> bytes read into the buffer.
ReadInto = Callable[[str, int, memoryview], int]

RESERVED = ".mink-"
try:
    _IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024)
except (AttributeError, ValueError, OSError):
    _IOV_MAX = 16
_RETRIABLE_ERRNOS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EMFILE,
    errno.ENFILE,
    errno.ENOMEM,
    errno.EAGAIN,
    errno.EINTR,
}
_PERMISSION_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}
_NO_LINK_ERRNOS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK}
_fdatasync = getattr(os, "fdatasync", os.fsync)
_O_DIRECT = getattr(os, "O_DIRECT", 0)
# Through the page cache (not direct, below), an object larger than this is written and
# fdatasynced a step at a time, unless it is a WAL object (WAL_PREFIX), written and synced
# at once whatever its size: its latency is a commit's, and under load one grows past
# wal_max_bytes (the buffer is sealed whole while the uploads are busy: group commit);
# synced in steps it took produce throughput at 3 and 12 partitions down 18-20%. A big
# object of any other kind is background work (a stream object, a compacted or KV snapshot
# object), and one fdatasync of all of it writes back tens of MiB in one go; ext4
# (data=ordered) makes the WAL's own fsyncs meanwhile wait for that writeback in its
# journal commit. In steps, each wait is for one step at most: produce p99 at 20 MB/s with
# tiering 37-53 -> 31-35 ms, p99.9 92-105 -> 44-48 ms (benchmarks.kafka --scenarios latency
# --rates 20, three runs each).
STEPPED_SYNC_ABOVE = 8 * 1024 * 1024
SYNC_STEP_BYTES = 1024 * 1024
# Direct I/O: where the filesystem takes O_DIRECT, objects are written (and compose's ranges
# read) around the page cache, a MiB at a time through a reused aligned buffer. Every byte
# written through the page cache lands in a page the kernel takes from its free lists, and
# on a VM whose balloon hands free pages back to the host (virtio free page reporting) each
# of those is a fault to the host: 1 GiB written and fdatasynced 8 MiB at a time cost
# 1.5-3.1 CPU-s buffered against 0.13-0.16 direct (the copy into the aligned buffer
# included) on this project's 2-core VM, and the node's produce path spent half its CPU in
# that kernel copy. The node keeps its own caches (the tail and block caches) of what is
# read again; objects are immutable, and a reader of a directly written object reads it
# from the disk.
DIRECT_ALIGN = 4096
# Reads this large or larger go around the page cache too (the block cache's 1 MiB blocks);
# smaller ones (a footer, a batch header) through it.
DIRECT_READ_ABOVE = 64 * 1024
# Smaller objects are written through the page cache (see _write_buffers).
DIRECT_WRITE_ABOVE = 256 * 1024
# compose resolves its parts on the event loop this many at a time, a checkpoint between:
# a 32 MiB stream object's 8,000 ranges of 4 KiB took 15 ms in one go, every other task
# of the node waiting (a leader's commits among them); a step is about a ms.
_RESOLVE_STEP = 500


class FileObjectStore:
    def __init__(self, root: str, *, fsync: bool = True, direct: bool = True) -> None:
        if not os.path.isabs(root):
            raise ObjectStoreConfigError(
                f"file:// store needs an absolute path, got {root!r} (write file:///abs/path)"
            )
        self.root = os.path.normpath(root)
        self.fsync = fsync  # False only for tests and benchmarks: objects may be lost on power loss
        # O_DIRECT: tried first unless turned off (`?direct=false`), given up for the store's
        # lifetime at the first refusal (tmpfs, some network filesystems).
        self.direct = direct
        self._closed = False

    def __repr__(self) -> str:
        return f"FileObjectStore({self.root!r})"

    async def __aenter__(self) -> FileObjectStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- plumbing --

    async def _run(self, op: str, key: str, fn: Callable[[], T]) -> T:
        if self._closed:
            raise ObjectStoreError("the object store is closed")
        try:
            return await trio.to_thread.run_sync(fn)
        except ObjectStoreError:
            raise
        except OSError as exc:
            raise self._os_error(op, key, exc) from exc

    def _os_error(self, op: str, key: str, exc: OSError) -> ObjectStoreError:
        what = f"{op} {key!r} in {self.root}: {exc.strerror or exc}"
        if exc.errno in _RETRIABLE_ERRNOS:
            return ObjectStoreUnavailable(what)
        if exc.errno in _PERMISSION_ERRNOS:
            return ObjectStoreConfigError(
                f"{what}; fix the folder's permissions (this process runs as uid {os.geteuid()})"
            )
        if not os.path.isdir(self.root):
            return ObjectStoreConfigError(
                f"{what}; the folder {self.root} is missing: create it or fix the file:// URL"
            )
        return ObjectStoreError(what)

    def _path(self, key: str) -> str:
        check_key(key)
        parts = key.split("/")
        if any(part.startswith(RESERVED) for part in parts):
            raise ValueError(f"invalid object key {key!r}: names starting with {RESERVED!r} are reserved")
        return os.path.join(self.root, *parts)

    def _makedirs(self, directory: str) -> list[str]:
        """Create `directory` and its missing parents below the root; return the ones that
        were missing, top-down (their parents' entries need an fsync)."""
        missing = []
        d = directory
        while d != self.root and not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        if d == self.root and not os.path.isdir(d):
            raise ObjectStoreConfigError(
                f"the object store folder {self.root} does not exist: create it or fix the file:// URL"
            )
        missing.reverse()
        for d in missing:
            try:
                os.mkdir(d)
            except FileExistsError:
                if not os.path.isdir(d):
                    raise ObjectStoreError(f"{d} is an object, cannot create objects below it") from None
        return missing

    def _open_new(self, path: str, *, direct: bool, exists: bool = False) -> tuple[int, bool]:
        """A new file (O_EXCL; `exists`: the empty one we made) to write, and whether it
        is open with O_DIRECT (asked for with `direct`, and the store still tries it)."""
        flags = os.O_WRONLY | os.O_CLOEXEC | (0 if exists else os.O_CREAT | os.O_EXCL)
        if direct and self.direct and _O_DIRECT:
            try:
                return os.open(path, flags | _O_DIRECT, 0o666), True
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._refuse_direct(exc)
        return os.open(path, flags, 0o666), False

    def _refuse_direct(self, exc: OSError) -> None:
        """This filesystem does not take O_DIRECT: the store writes and reads through the
        page cache from now on."""
        if self.direct:
            self.direct = False
            log.info("the filesystem of %s refused O_DIRECT (%s): objects go through the "
                     "page cache", self.root, exc.strerror or exc)

    def _fsync_dir(self, directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_buffers(self, fd: int, direct: bool, key: str, buffers: list[memoryview],
                       size: int) -> None:
        stepped = self.fsync and not key.startswith(WAL_PREFIX) and size > STEPPED_SYNC_ABOVE
        if direct:
            out = _DirectOutput(fd, sync=self.fsync)
            try:
                for buf in buffers:
                    out.write(buf)
                out.finish()
            finally:
                out.close()
        elif not self.fsync:
            _write_all(fd, buffers)
        elif stepped:
            _write_synced(fd, buffers, SYNC_STEP_BYTES)
        else:
            _write_all(fd, buffers)
            _fdatasync(fd)

    def _write_parts(self, fd: int, direct: bool, parts: list[memoryview | _Ranges],
                     throttle: Callable[[int], None] | None) -> None:
        """compose's parts written in order: buffers as they are, ranges copied from their
        objects; through the page cache synced a step at a time (a composed object is
        background work), directly once at the end."""
        out = (_DirectOutput(fd, throttle, sync=self.fsync) if direct
               else _SyncedOutput(fd, SYNC_STEP_BYTES if self.fsync else None, throttle))
        try:
            for part in parts:
                if isinstance(part, memoryview):
                    out.write(part)
                else:
                    out.copy_ranges(part)
            out.finish()
        finally:
            out.close()

    # -- operations --

    async def create(self, key: str, data: Data) -> None:
        path = self._path(key)
        buffers = as_buffers(data)
        size = sum(b.nbytes for b in buffers)
        # A small object through the page cache: an O_DIRECT write waits for the device
        # (80 KB, a WAL object at 20 MB/s: 0.56-0.61 ms written and fdatasynced, against
        # 0.42-0.45 through the page cache).
        if size < DIRECT_WRITE_ABOVE and _create_file is not None:
            await self._create_small(key, path, buffers, size)
            return
        await self._run("create", key, lambda: self._create_sync(
            key, path, size >= DIRECT_WRITE_ABOVE,
            lambda fd, direct: self._write_buffers(fd, direct, key, buffers, size)))

    async def _create_small(self, key: str, path: str, buffers: list[memoryview],
                            size: int) -> None:
        """_create_sync of a small object through the page cache, its syscalls in a thread
        of the compiled helper's own that never takes the GIL (see _create_file.pyx); a
        thread that cannot be started is ObjectStoreUnavailable when none runs. Its
        wait is shielded: the thread writes from the caller's buffers until it ends, and a
        create's syscalls end (a worker thread's are not abandoned either). Where the
        directory is missing (or a parent is an object), _create_sync's way, which makes or
        explains it."""
        if self._closed:
            raise ObjectStoreError("the object store is closed")
        parent = os.path.dirname(path)
        tmp = os.path.join(parent, f"{RESERVED}tmp-{secrets.token_hex(8)}")
        try:
            job = _create_file.CreateJob(os.fsencode(tmp), os.fsencode(path),
                                         os.fsencode(parent), buffers, self.fsync)
        except OSError as exc:  # no eventfd, or no thread to run it (EAGAIN, EMFILE)
            raise self._os_error("create", key, exc) from exc
        try:
            with trio.CancelScope(shield=True):
                await trio.lowlevel.wait_readable(job.fileno)
            stage, err = job.result()
        finally:
            trio.lowlevel.notify_closing(job.fileno)
            job.close()
        if stage != _create_file.CREATED:
            await self._run("create", key, lambda: self._not_created_small(
                key, path, buffers, size, stage, err))

    def _not_created_small(self, key: str, path: str, buffers: list[memoryview], size: int,
                           stage: int, err: int) -> None:
        if stage == _create_file.OPEN and err in (errno.ENOENT, errno.ENOTDIR):
            self._create_sync(key, path, False,
                              lambda fd, direct: self._write_buffers(fd, False, key, buffers, size))
            return
        if stage == _create_file.LINK and err == errno.EEXIST:
            if os.path.isdir(path):
                raise ObjectStoreError(f"create {key!r}: objects exist below this key")
            raise ObjectExists(key)
        raise OSError(err, os.strerror(err))

    async def compose(self, key: str, parts: Sequence[Buffer | ObjectRange], *,
                      pace: Callable[[int], Awaitable[object]] | None = None) -> None:
        """`create(key, ...)` of the parts back to back, where an ObjectRange part is bytes of
        another object (ObjectNotFound if there is none, ObjectStoreError if it ends
        before the range does), copied file to file a MiB at a time: read with O_DIRECT
        into the aligned buffer the object is written from, or, through the page cache, in
        the kernel (copy_file_range), never into fresh memory of this process: tiering
        assembles a stream object from WAL objects' ranges so, at a third of the CPU of
        reading them into memory and writing them out again.
        `pace(n)` is awaited (on the event loop) after each MiB written, before the next:
        the copy of a large object spread out instead of in one burst."""
        throttle = None
        if pace is not None:
            def throttle(nbytes: int) -> None:
                trio.from_thread.run(pace, nbytes)
        path = self._path(key)
        resolved: list[memoryview | _Ranges] = []
        for n, part in enumerate(parts):
            if n % _RESOLVE_STEP == _RESOLVE_STEP - 1:
                await trio.lowlevel.checkpoint()
            self._resolve(resolved, part)
        await self._run("create", key, lambda: self._create_sync(
            key, path, True,
            lambda fd, direct: self._write_parts(fd, direct, resolved, throttle)))

    def compose_blocking(self, key: str, parts: Sequence[Buffer | ObjectRange],
                         throttle: Callable[[int], None] | None = None) -> None:
        """compose where there is no event loop (tiering's child process): the same copy,
        `throttle(n)` called after each MiB written; OSError as compose raises it."""
        path = self._path(key)
        resolved: list[memoryview | _Ranges] = []
        for part in parts:
            self._resolve(resolved, part)
        try:
            self._create_sync(key, path, True, lambda fd, direct: self._write_parts(
                fd, direct, resolved, throttle))
        except OSError as exc:
            raise self._os_error("create", key, exc) from exc

    def _resolve(self, resolved: list[memoryview | _Ranges], part: Buffer | ObjectRange) -> None:
        """compose's `part` added to `resolved`: a range to the run of ranges it ends, if
        it does (one _Ranges per run), a buffer as it is."""
        if isinstance(part, ObjectRange):
            check_range(part.start, part.end)
            if part.end < part.start:
                raise ValueError(f"byte range ends before it starts: {part}")
            ranges = resolved[-1] if resolved else None
            if not isinstance(ranges, _Ranges):
                ranges = _Ranges(self._path)
                resolved.append(ranges)
            ranges.add(part.key, part.start, part.end)
        else:
            resolved.extend(as_buffers(part))

    def _create_sync(self, key: str, path: str, direct: bool,
                     write: Callable[[int, bool], None]) -> None:
        """`write(fd, direct)` fills (and syncs) a temporary file, opened with O_DIRECT if
        `direct` asks for it and the store still tries it, then it becomes the object."""
        parent = os.path.dirname(path)
        tmp = os.path.join(parent, f"{RESERVED}tmp-{secrets.token_hex(8)}")
        made: list[str] = []
        try:
            fd, direct = self._open_new(tmp, direct=direct)
        except FileNotFoundError:
            made = self._makedirs(parent)
            fd, direct = self._open_new(tmp, direct=direct)
        try:
            try:
                write(fd, direct)
            except OSError as exc:
                if not (direct and exc.errno == errno.EINVAL):
                    raise
                # O_DIRECT opened but refused at the first write or read (this filesystem
                # wants a larger alignment, or none): through the page cache from now on.
                self._refuse_direct(exc)
                os.ftruncate(fd, 0)
                os.close(fd)
                fd = -1
                fd, direct = self._open_new(tmp, direct=False, exists=True)
                write(fd, direct)
            finally:
                if fd >= 0:
                    os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                if os.path.isdir(path):
                    raise ObjectStoreError(f"create {key!r}: objects exist below this key") from None
                raise ObjectExists(key) from None
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        if self.fsync:
            # The new name must survive a crash, and so must every directory we created.
            for d in dict.fromkeys([parent, *(os.path.dirname(m) for m in made)]):
                self._fsync_dir(d)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        path = self._path(key)
        check_range(start, end)
        return await self._run("get", key, lambda: self._get_sync(key, path, start, end))

    async def get_view(self, key: str, start: int = 0, end: int | None = None) -> memoryview:
        """get(), as a read-only view of memory of the range's own: for a cache that keeps
        what it reads (the block cache). A direct read with the compiled helper lands in
        memory used again once no view of it is left, with no copy on the way."""
        path = self._path(key)
        check_range(start, end)
        return await self._run("get", key,
                               lambda: self._get_sync(key, path, start, end, view=True))

    async def scan(self, fn: Callable[[ReadInto], T]) -> T:
        """`fn(read_into)` run in a worker thread, where `read_into(key, position, buffer)`
        fills `buffer` with an object's bytes from `position` and returns how many it read
        (fewer only at the object's end; ObjectNotFound if there is none): a reader that
        wants a few bytes here and there of many objects (the batch headers of WAL ranges)
        without a hop to a thread, or fresh memory, for each. Each object is opened once."""
        if self._closed:
            raise ObjectStoreError("the object store is closed")
        return await trio.to_thread.run_sync(lambda: self.scan_blocking(fn))

    def scan_blocking(self, fn: Callable[[ReadInto], T]) -> T:
        """scan where there is no event loop (tiering's child process), or in a thread."""
        files: dict[str, int] = {}
        current = ""  # the key being read, for the error

        def read_into(key: str, position: int, buffer: memoryview) -> int:
            nonlocal current
            current = key
            fd = files.get(key)
            if fd is None:
                fd = files[key] = _open_object(key, self._path(key))
            got = 0
            while got < len(buffer):
                n = os.preadv(fd, [buffer[got:]], position + got)
                if n == 0:
                    break
                got += n
            return got

        try:
            return fn(read_into)
        except OSError as exc:
            raise self._os_error("get", current, exc) from exc
        finally:
            for fd in files.values():
                os.close(fd)

    def _get_sync(self, key: str, path: str, start: int, end: int | None, *,
                  view: bool = False) -> bytes | memoryview:
        data = None
        if self.direct and (end is None or end - start >= DIRECT_READ_ABOVE):
            try:
                data = self._read(key, path, start, end, direct=True, view=view)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._refuse_direct(exc)
        if data is None:
            data = self._read(key, path, start, end, direct=False)
        return memoryview(data) if view and not isinstance(data, memoryview) else data

    def _read(self, key: str, path: str, start: int, end: int | None, *,
              direct: bool, view: bool = False) -> bytes | memoryview:
        fd = _open_object(key, path, direct)
        try:
            st = os.fstat(fd)
            stop = st.st_size if end is None else min(end, st.st_size)
            if start >= stop:
                return b""
            if direct and view and _read_direct_view is not None:
                data = _read_direct_view(fd, start, stop)
                if len(data) != stop - start:
                    raise ObjectStoreError(f"a read ended at byte {start + len(data)} of {stop}")
                return data
            if direct:
                return _read_direct(fd, start, stop)
            want = stop - start
            data = os.pread(fd, want, start)
            if len(data) == want:
                return data
            chunks = [data]  # short read (rare: signals, network filesystems)
            got = len(data)
            while got < want:
                chunk = os.pread(fd, want - got, start + got)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    async def delete(self, key: str) -> None:
        path = self._path(key)
        await self._run("delete", key, lambda: _unlink_if_present(path))

    async def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        keys = await self._run("list", prefix, lambda: self._list_sync(prefix))
        if start_after is not None:
            keys = keys[bisect.bisect_right(keys, start_after):]
        return keys

    def _list_sync(self, prefix: str) -> list[str]:
        dir_part, _, name_prefix = prefix.rpartition("/")
        if dir_part:
            try:
                check_key(dir_part)
            except ValueError:
                return []  # no valid key can start with this prefix
            top = os.path.join(self.root, *dir_part.split("/"))
        else:
            top = self.root
            if not os.path.isdir(top):
                raise ObjectStoreConfigError(
                    f"the object store folder {self.root} does not exist: create it or fix the file:// URL"
                )
        keys: list[str] = []
        stack = [(top, dir_part, name_prefix)]
        while stack:
            directory, rel, name_prefix = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                name = entry.name
                if name.startswith(RESERVED) or not name.startswith(name_prefix):
                    continue
                key = f"{rel}/{name}" if rel else name
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, key, ""))
                elif entry.is_file():
                    keys.append(key)
        keys.sort()
        return keys

    async def check(self) -> None:
        if self._closed:
            raise ObjectStoreError("the object store is closed")
        try:
            await trio.to_thread.run_sync(self._check_sync)
        except OSError as exc:
            raise ObjectStoreConfigError(f"the object store folder {self.root} is not usable: {exc}") from exc

    def _check_sync(self) -> None:
        root = self.root
        if not os.path.exists(root):
            raise ObjectStoreConfigError(
                f"the object store folder {root} does not exist: "
                f"create it (mkdir -p {root}) or fix the file:// URL"
            )
        if not os.path.isdir(root):
            raise ObjectStoreConfigError(f"the object store path {root} is not a folder: fix the file:// URL")
        token = secrets.token_hex(8)
        tmp = os.path.join(root, f"{RESERVED}check-{token}.tmp")
        final = os.path.join(root, f"{RESERVED}check-{token}")
        try:
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
                try:
                    os.write(fd, b"mink")
                    _fdatasync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise ObjectStoreConfigError(
                    f"cannot write in the object store folder {root} ({exc.strerror}): "
                    f"make it writable by this process (uid {os.geteuid()}) or choose another folder"
                ) from exc
            try:
                os.link(tmp, final)
            except OSError as exc:
                if exc.errno in _NO_LINK_ERRNOS:
                    raise ObjectStoreConfigError(
                        f"the filesystem of {root} does not support hard links ({exc.strerror}), which the "
                        f"file:// store needs for create-if-absent: choose a local POSIX filesystem"
                    ) from exc
                raise ObjectStoreConfigError(f"cannot create files in {root}: {exc.strerror}") from exc
            try:
                os.link(tmp, final)
            except FileExistsError:
                pass
            else:
                raise ObjectStoreConfigError(
                    f"the filesystem of {root} does not refuse link() over an existing name"
                )
            with open(final, "rb") as f:
                if f.read() != b"mink":
                    raise ObjectStoreConfigError(f"a file written in {root} did not read back")
        finally:
            _unlink_if_present(tmp)
            _unlink_if_present(final)

    async def aclose(self) -> None:
        self._closed = True


def _write_all(fd: int, buffers: list[memoryview]) -> None:
    pending = [b for b in buffers if b.nbytes]
    i = 0
    while i < len(pending):
        written = os.writev(fd, pending[i : i + _IOV_MAX])
        while written:
            head = pending[i]
            if written >= head.nbytes:
                written -= head.nbytes
                i += 1
            else:
                pending[i] = head[written:]
                written = 0


def _write_synced(fd: int, buffers: list[memoryview], step: int) -> None:
    """The buffers written in order, fdatasynced after every `step` bytes and at the end."""
    out = _SyncedOutput(fd, step)
    for buf in buffers:
        out.write(buf)
    out.finish()


def _open_object(key: str, path: str, direct: bool = False) -> int:
    """A read-only descriptor of the object at `path` (O_DIRECT if `direct`);
    ObjectNotFound if there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (_O_DIRECT if direct else 0))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise ObjectNotFound(key) from None
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise ObjectNotFound(key)
    return fd


def _open_source(key: str, path: str, direct: bool) -> int:
    """A descriptor of an object compose copies from: O_DIRECT (with a direct output) only
    if it was written so (DIRECT_WRITE_ABOVE or more). A smaller one went through the page
    cache, where it most likely still is (tiering copies WAL objects of the last minute):
    read around it, each of a stream object's hundreds of ranges was a read of the device,
    queued with the WAL's own writes and syncs."""
    fd = _open_object(key, path)
    if direct and os.fstat(fd).st_size >= DIRECT_WRITE_ABOVE:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | _O_DIRECT)
    return fd


class _Ranges:
    """Consecutive ObjectRange parts of a compose: the objects they read (keys, and their
    paths fs-encoded) and, range by range, the object's index among them, start and end."""

    __slots__ = ("_index", "_path", "ends", "keys", "paths", "starts", "which")

    def __init__(self, path: Callable[[str], str]) -> None:
        self._path = path  # an object's path from its key
        self._index: dict[str, int] = {}
        self.keys: list[str] = []
        self.paths: list[bytes] = []
        self.which, self.starts, self.ends = array("q"), array("q"), array("q")

    def add(self, key: str, start: int, end: int) -> None:
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.keys)
            self.keys.append(key)
            self.paths.append(os.fsencode(self._path(key)))
        self.which.append(i)
        self.starts.append(start)
        self.ends.append(end)

    def short(self, i: int) -> ObjectStoreError:
        """The error of range i, whose object ends before it does."""
        return ObjectStoreError(f"compose: {self.keys[self.which[i]]!r} ends before byte "
                                f"{self.ends[i]}")


class _SyncedOutput:
    """Appends to `fd` at its file position, fdatasynced after every `step` bytes and at
    the end (`step` None: never). Buffers wait to be written by one writev a step at a
    time; a copied range goes after them."""

    direct = False  # written with O_DIRECT (and so copies read with it where they can)

    def __init__(self, fd: int, step: int | None,
                 throttle: Callable[[int], None] | None = None) -> None:
        self.fd = fd
        self.step = step
        self.throttle = throttle  # called after each SYNC_STEP_BYTES written
        self.unpaced = 0  # written since the last throttle call
        self.unsynced = 0  # written since the last fdatasync
        self.pending: list[memoryview] = []
        self.pending_bytes = 0

    def _room(self, n: int) -> int:
        """How much of `n` more bytes fits before the next sync."""
        if self.step is None:
            return n
        return min(n, self.step - self.unsynced - self.pending_bytes)

    def _written(self, n: int) -> None:
        self.unsynced += n
        if self.step is not None and self.unsynced >= self.step:
            _fdatasync(self.fd)
            self.unsynced = 0
        if self.throttle is not None:
            self.unpaced += n
            if self.unpaced >= SYNC_STEP_BYTES:
                self.throttle(self.unpaced)
                self.unpaced = 0

    def _write_pending(self) -> None:
        if self.pending:
            _write_all(self.fd, self.pending)
            written, self.pending, self.pending_bytes = self.pending_bytes, [], 0
            self._written(written)

    def write(self, buf: memoryview) -> None:
        while buf.nbytes:
            take = self._room(buf.nbytes)
            self.pending.append(buf[:take])
            self.pending_bytes += take
            buf = buf[take:]
            if self.step is not None and self.unsynced + self.pending_bytes >= self.step:
                self._write_pending()

    def copy(self, src: int, start: int, end: int) -> int:
        """Bytes [start, end) of `src` appended (fewer if it ends first): how many."""
        self._write_pending()
        position = start
        while position < end:
            n = _copy_range(src, self.fd, position, self._room(end - position))
            if n == 0:
                break
            position += n
            self._written(n)
        return position - start

    def copy_ranges(self, ranges: _Ranges) -> None:
        """The ranges appended, each object opened once (`_open_source`)."""
        sources: dict[int, int] = {}
        try:
            for i, (which, start, end) in enumerate(zip(ranges.which, ranges.starts,
                                                        ranges.ends)):
                src = sources.get(which)
                if src is None:
                    src = sources[which] = _open_source(ranges.keys[which],
                                                        ranges.paths[which], self.direct)
                if self.copy(src, start, end) != end - start:
                    raise ranges.short(i)
        finally:
            for src in sources.values():
                os.close(src)

    def finish(self) -> None:
        self._write_pending()
        if self.step is not None and self.unsynced:
            _fdatasync(self.fd)
            self.unsynced = 0

    def close(self) -> None:
        pass


class _AlignedBuffers:
    """Page-aligned buffers (anonymous mmaps) of one size, reused: memory this process
    touched before, never fresh pages for each object (see DIRECT_ALIGN)."""

    def __init__(self, size: int, keep: int) -> None:
        self.size = size
        self.keep = keep
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self) -> mmap.mmap:
        with self._lock:
            if self._free:
                return self._free.pop()
        return mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE)  # not shmem-backed

    def give(self, buf: mmap.mmap) -> None:
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buf)
                return
        buf.close()


# kept: the uploads, tiering jobs (two each) and cold reads in flight at once, about
_ALIGNED = _AlignedBuffers(SYNC_STEP_BYTES, keep=16)
# Direct reads: a block cache's block (a MiB from any offset) in one buffer; larger reads
# get a buffer of their own.
_ALIGNED_READS = _AlignedBuffers(2 * SYNC_STEP_BYTES, keep=8)


def _round_up(n: int) -> int:
    return -(-n // DIRECT_ALIGN) * DIRECT_ALIGN


class _DirectOutput(_SyncedOutput):
    """_SyncedOutput of a file opened with O_DIRECT: the bytes are gathered in an aligned
    buffer and written from it a MiB at a time, the last part block through the page cache;
    a copied range is read with O_DIRECT into a second aligned buffer (its source opened
    with O_DIRECT). With `sync`, the object is fdatasynced once, at the end: nothing of it
    waits in the page cache for a writeback that would hold the WAL's fsyncs up in the
    journal. close() gives the buffers back."""

    direct = True

    def __init__(self, fd: int, throttle: Callable[[int], None] | None = None, *,
                 sync: bool) -> None:
        super().__init__(fd, None, throttle)
        self.sync = sync
        self.stage = _ALIGNED.take()
        self.view = memoryview(self.stage)
        self.fill = 0  # bytes in the stage
        self.offset = 0  # the file offset the stage is written at
        self.source: mmap.mmap | None = None

    def write(self, buf: memoryview) -> None:
        size = _ALIGNED.size
        while buf.nbytes:
            n = min(buf.nbytes, size - self.fill)
            self.view[self.fill:self.fill + n] = buf[:n]
            self.fill += n
            buf = buf[n:]
            if self.fill == size:
                _pwrite_all(self.fd, self.view, self.offset)
                self.offset += size
                self.fill = 0
                self._written(size)

    def copy(self, src: int, start: int, end: int) -> int:
        if self.source is None:
            self.source = _ALIGNED.take()
        copied = 0
        with memoryview(self.source) as window:
            for piece in _read_pieces(src, window, start, end):
                self.write(piece)
                copied += piece.nbytes
        return copied

    def copy_ranges(self, ranges: _Ranges) -> None:
        """With the compiled helper, a MiB of the ranges at a time in one call that holds no
        GIL (see _range_copy.pyx): the event loop beside it keeps the GIL for itself."""
        if _range_copy is None:
            super().copy_ranges(ranges)
            return
        if self.source is None:
            self.source = _ALIGNED.take()
        copier = _range_copy.RangeCopier(
            self.fd, self.stage, self.fill, self.offset, self.source, ranges.paths,
            ranges.which, ranges.starts, ranges.ends, _O_DIRECT, DIRECT_WRITE_ABOVE)
        try:
            while (status := copier.step()) == _range_copy.FLUSHED:
                self._written(_ALIGNED.size)
            self.fill, self.offset = copier.fill, copier.offset
        finally:
            copier.close()
        if status == _range_copy.NOT_FOUND:
            raise ObjectNotFound(ranges.keys[ranges.which[copier.index]])
        if status == _range_copy.SHORT:
            raise ranges.short(copier.index)
        if status == _range_copy.OS_ERROR:
            raise OSError(copier.error, os.strerror(copier.error))

    def finish(self) -> None:
        aligned = self.fill - self.fill % DIRECT_ALIGN
        if aligned:
            _pwrite_all(self.fd, self.view[:aligned], self.offset)
        if aligned < self.fill:
            # The last part block through the page cache (O_DIRECT cleared): padding it and
            # cutting the file to size cost a read of that block back and a truncate.
            fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~_O_DIRECT)
            _pwrite_all(self.fd, self.view[aligned:self.fill], self.offset + aligned)
        if self.sync:
            _fdatasync(self.fd)

    def close(self) -> None:
        self.view.release()
        _ALIGNED.give(self.stage)
        if self.source is not None:
            _ALIGNED.give(self.source)
            self.source = None


def _read_pieces(fd: int, window: memoryview, start: int, end: int):
    """Bytes [start, end) of a file opened with O_DIRECT, a window's worth at a time: each
    piece a view of `window` (valid until the next), fewer bytes in all only where the file
    ends first."""
    position = start
    while position < end:
        aligned = position - position % DIRECT_ALIGN
        want = min(_round_up(end - aligned), len(window))
        skip = position - aligned
        # one read: an O_DIRECT read is short only at the end of the file
        got = min(os.preadv(fd, [window[:want]], aligned) - skip, end - position)
        if got <= 0:
            return
        yield window[skip:skip + got]
        position += got


def _read_direct(fd: int, start: int, stop: int) -> bytes:
    """Bytes [start, stop) of a file opened with O_DIRECT (stop within the file): the
    aligned blocks holding them read into one aligned buffer, then copied out once. (Read a
    MiB at a time and joined, a block cache's MiB cost two copies: 0.43 CPU-s per GB read
    against 0.22.)"""
    aligned = start - start % DIRECT_ALIGN
    size = _round_up(stop - aligned)
    pool = _ALIGNED_READS if size <= _ALIGNED_READS.size else None
    buffer = pool.take() if pool else mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    try:
        with memoryview(buffer) as window:
            got = 0
            while got < size:
                # an O_DIRECT read is short only at the end of the file
                n = os.preadv(fd, [window[got:size]], aligned + got)
                if n == 0:
                    break
                got += n
            got = min(got, stop - aligned) - (start - aligned)
            if got != stop - start:
                raise ObjectStoreError(f"a read ended at byte {start + max(got, 0)} of {stop}")
            return bytes(window[start - aligned:stop - aligned])
    finally:
        if pool:
            pool.give(buffer)
        else:
            buffer.close()


def _pwrite_all(fd: int, buf: memoryview, offset: int) -> None:
    done = 0
    while done < buf.nbytes:
        done += os.pwrite(fd, buf[done:], offset + done)


_copy_file_range = getattr(os, "copy_file_range", None)
# copy_file_range refused (another filesystem on an older kernel, a filesystem without it):
# the bytes go through a buffer instead.
_NO_COPY_ERRNOS = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}
_COPY_BUFFER = 1024 * 1024


def _copy_range(src: int, dst: int, position: int, count: int) -> int:
    """Up to `count` bytes of `src` from `position` appended to `dst`: how many (0 at the
    end of `src`)."""
    if _copy_file_range is not None:
        try:
            return _copy_file_range(src, dst, count, position)
        except OSError as exc:
            if exc.errno not in _NO_COPY_ERRNOS:
                raise
    data = os.pread(src, min(count, _COPY_BUFFER), position)
    _write_all(dst, [memoryview(data)])
    return len(data)


def _unlink_if_present(path: str) -> None:
    try:
        os.unlink(path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        pass

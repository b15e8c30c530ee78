"""file:///abs/path — objects as files under a folder (one node, or a shared POSIX filesystem).

create: the bytes go to a temporary file in the object's directory, are fsynced, and the
object appears atomically and only if absent with `link(tmp, final)` (EEXIST: ObjectExists);
then the temporary name is removed and the directory fsynced. A crash leaves at most a
`.mink-tmp-*` file behind, never a partial object. Directories are created as needed and
never removed (there are few: one per node epoch for the WAL).

Every operation is one hop to a worker thread (`trio.to_thread.run_sync`), not one per syscall.
Names starting with `.mink-` are reserved for these temporary files and are never listed.
On a filesystem, a key cannot also be a "directory" of another key ("a" and "a/b").
"""

from __future__ import annotations

import bisect
import errno
import os
import secrets
import stat
from collections.abc import Callable, Sequence
from typing import TypeVar

import trio

from .base import (
    Data,
    ObjectExists,
    ObjectNotFound,
    ObjectStoreConfigError,
    ObjectStoreError,
    ObjectStoreUnavailable,
    as_buffers,
    check_key,
    check_range,
)

T = TypeVar("T")

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
# An object larger than this is written and fdatasynced a step at a time. A WAL object (8 MiB
# at most by default) is written and synced at once: its latency is a commit's. A bigger one
# is background work (a stream object, a compacted or KV snapshot object), and one fdatasync
# of all of it writes back tens of MiB in one go; ext4 (data=ordered) makes the WAL's own
# fsyncs meanwhile wait for that writeback in its journal commit. In steps, each wait is for
# one step at most: produce p99 at 20 MB/s with tiering 37-53 -> 31-35 ms, p99.9 92-105 ->
# 44-48 ms (benchmarks.kafka --scenarios latency --rates 20, three runs each).
STEPPED_SYNC_ABOVE = 8 * 1024 * 1024
SYNC_STEP_BYTES = 1024 * 1024


class FileObjectStore:
    def __init__(self, root: str, *, fsync: bool = True) -> None:
        if not os.path.isabs(root):
            raise ObjectStoreConfigError(
                f"file:// store needs an absolute path, got {root!r} (write file:///abs/path)"
            )
        self.root = os.path.normpath(root)
        self.fsync = fsync  # False only for tests and benchmarks: objects may be lost on power loss
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

    def _fsync_dir(self, directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- operations --

    async def create(self, key: str, data: Data) -> None:
        path = self._path(key)
        buffers = as_buffers(data)
        await self._run("create", key, lambda: self._create_sync(key, path, buffers))

    def _create_sync(self, key: str, path: str, buffers: list[memoryview]) -> None:
        parent = os.path.dirname(path)
        tmp = os.path.join(parent, f"{RESERVED}tmp-{secrets.token_hex(8)}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        made: list[str] = []
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileNotFoundError:
            made = self._makedirs(parent)
            fd = os.open(tmp, flags, 0o666)
        try:
            try:
                if not self.fsync:
                    _write_all(fd, buffers)
                elif sum(b.nbytes for b in buffers) > STEPPED_SYNC_ABOVE:
                    _write_synced(fd, buffers, SYNC_STEP_BYTES)
                else:
                    _write_all(fd, buffers)
                    _fdatasync(fd)
            finally:
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

    async def get_ranges(self, ranges: Sequence[tuple[str, int, int | None]]) -> list[bytes]:
        """Several `get`s in one hop to a worker thread, in order: a backend extra for
        readers of many small ranges (tiering reads one range per WAL flush), which
        otherwise pay a thread hop and a task each. The first failing range raises, as its
        own `get` would."""
        paths = [(key, self._path(key), start, end) for key, start, end in ranges]
        for _, _, start, end in paths:
            check_range(start, end)
        if self._closed:
            raise ObjectStoreError("the object store is closed")
        return await trio.to_thread.run_sync(self._get_ranges_sync, paths)

    def _get_ranges_sync(self, paths) -> list[bytes]:
        out = []
        for key, path, start, end in paths:
            try:
                out.append(self._get_sync(key, path, start, end))
            except OSError as exc:
                raise self._os_error("get", key, exc) from exc
        return out

    def _get_sync(self, key: str, path: str, start: int, end: int | None) -> bytes:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(key) from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise ObjectNotFound(key)
            stop = st.st_size if end is None else min(end, st.st_size)
            if start >= stop:
                return b""
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
    batch: list[memoryview] = []
    size = 0
    for buf in buffers:
        while buf.nbytes:
            take = min(buf.nbytes, step - size)
            batch.append(buf[:take])
            buf = buf[take:]
            size += take
            if size >= step:
                _write_all(fd, batch)
                _fdatasync(fd)
                batch, size = [], 0
    if batch:  # else the last step was the end, and synced
        _write_all(fd, batch)
        _fdatasync(fd)


def _unlink_if_present(path: str) -> None:
    try:
        os.unlink(path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        pass

"""One PostgreSQL for a test session, and a fresh database for every node or cluster.

`TestPostgres.start()` runs the embedded PostgreSQL (the `pgserver` wheel's binaries, fsync
off) in a temporary folder, or uses the server named by `MINK_TESTING_POSTGRES_URL` (a
superuser URL; databases are created there and dropped again). Either way it creates a
template database once and applies Mink's migrations to it; `new_database()` then clones it
(`CREATE DATABASE ... TEMPLATE`), which costs tens of milliseconds instead of the migrations'
hundreds. Database names carry the process id, so pytest-xdist workers sharing an outside
server never collide.

Off the critical path: a database given back is dropped by a background thread, which then
clones the next one ahead of time (a "spare"), so the next test takes a ready database
instead of waiting for a clone. Dropping right before cloning made the clone three to four
times slower (DROP DATABASE waits for a checkpoint): done in this order in the background,
neither is on a test's path. A spare is a clone no one has used: every caller still gets a
database of its own, fresh from the template.

The methods are blocking (sync psycopg): call them from a thread when on trio.
"""

from __future__ import annotations

import itertools
import os
import queue
import shutil
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ENV_URL = "MINK_TESTING_POSTGRES_URL"


class TestPostgres:
    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, url: str | None = None) -> None:
        self._outside_url = url if url is not None else os.environ.get(ENV_URL)
        self._server = None  # an EmbeddedPostgres we started
        self._folder: Path | None = None
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._databases: set[str] = set()
        self.url: str | None = None  # the maintenance database (superuser)
        self.template = f"mink_template_{os.getpid()}"
        self.spares = 1  # databases cloned ahead of time
        self._spare: list[str] = []
        self._chores: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._pending = 0  # chores queued and not done
        self._spare_in_flight = False
        self._idle = threading.Condition(self._lock)

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> TestPostgres:
        import psycopg

        from mink.testing import _parts

        if self._outside_url:
            self.url = self._outside_url
        else:
            self._folder = Path(tempfile.mkdtemp(prefix="mink-testing-pg-"))
            self._server = _parts.EmbeddedPostgres(self._folder / "data", durable=False)
            try:
                self._server.start()
            except BaseException:
                shutil.rmtree(self._folder, ignore_errors=True)
                raise
            self.url = self._server.url
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.template}")
            conn.execute(f"CREATE DATABASE {self.template}")
        _parts.migrate_sync(self.url_for(self.template))
        self._worker = threading.Thread(target=self._work, name="mink-testing-pg", daemon=True)
        self._worker.start()
        self._refill()
        return self

    def stop(self) -> None:
        """Drop what this session created; stop the embedded server and remove its folder."""
        import psycopg

        if self._worker is not None:
            self._chores.put(None)
            self._worker.join(60)
            self._worker = None
        try:
            if self.url is not None and (self._server is None or self._server.running()):
                with psycopg.connect(self.url, autocommit=True) as conn:
                    for name in sorted(self._databases):
                        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                    conn.execute(f"DROP DATABASE IF EXISTS {self.template} WITH (FORCE)")
                self._databases.clear()
        finally:
            if self._server is not None:
                if self._server.running():
                    self._server.stop("immediate")
                self._server = None
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None

    @property
    def server(self):
        """The embedded server this session started (an `EmbeddedPostgres`: `stop(mode)`,
        `start()`, `running()`, for tests of PostgreSQL outages), or None when the session
        uses an outside server (MINK_TESTING_POSTGRES_URL)."""
        return self._server

    def __enter__(self) -> TestPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- databases --------------------------------------------------------------------------

    def url_for(self, database: str) -> str:
        assert self.url is not None, "TestPostgres.start() first"
        parts = urlsplit(self.url)
        return urlunsplit(parts._replace(path="/" + database))

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        return parts.hostname or "127.0.0.1", parts.port or 5432

    def new_database(self) -> str:
        """A fresh, migrated database of the caller's own (a clone of the template no one
        has used); returns its URL. Takes a spare when one is ready, else clones now."""
        with self._idle:
            # A spare being cloned now is ready sooner than a clone started beside it.
            self._idle.wait_for(lambda: self._spare or not self._spare_in_flight, 60)
            name = self._spare.pop(0) if self._spare else None
        if name is None:
            name = self._clone()
        self._refill()
        return self.url_for(name)

    def drop_database(self, url: str, *, wait: bool = True) -> None:
        """Drop a database from new_database(); wait=False leaves it to the background
        thread (then cloning the next spare), which `stop()` and `settle()` wait for."""
        name = urlsplit(url).path.lstrip("/")
        if wait or self._worker is None:
            self._drop(name)
        else:
            self._queue(self._drop, name)
            self._refill()

    def settle(self, timeout: float = 60.0) -> None:
        """Wait until the background drops and clones are done."""
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _clone(self) -> str:
        import psycopg

        with self._lock:
            name = f"mink_{os.getpid()}_{next(self._counter)}"
            self._databases.add(name)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {self.template}")
        return name

    def _drop(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        with self._lock:
            self._databases.discard(name)

    def _refill(self) -> None:
        if self._worker is not None:
            self._queue(self._clone_spare)

    def _clone_spare(self) -> None:
        with self._lock:
            if len(self._spare) >= self.spares:
                return
            self._spare_in_flight = True
        try:
            name = self._clone()
            with self._idle:
                self._spare.append(name)
        finally:
            with self._idle:
                self._spare_in_flight = False
                self._idle.notify_all()

    def _queue(self, fn, *args) -> None:
        with self._lock:
            self._pending += 1
        self._chores.put((fn, args))

    def _work(self) -> None:
        while (chore := self._chores.get()) is not None:
            fn, args = chore
            try:
                fn(*args)
            except Exception:  # the server went away (a test stopped it): stop() cleans up
                pass
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

"""One PostgreSQL for a test session, and a fresh database for every node or cluster.

`TestPostgres.start()` runs the embedded PostgreSQL (the `pgserver` wheel's binaries, fsync
off) in a temporary folder, or uses the server named by `MINK_TESTING_POSTGRES_URL` (a
superuser URL; databases are created there and dropped again). Either way it creates a
template database once and applies Mink's migrations to it; `new_database()` then clones it
(`CREATE DATABASE ... TEMPLATE`), which costs tens of milliseconds instead of the migrations'
hundreds. Database names carry the process id, so pytest-xdist workers sharing an outside
server never collide.

The methods are blocking (sync psycopg): call them from a thread when on trio.
"""

from __future__ import annotations

import itertools
import os
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
        return self

    def stop(self) -> None:
        """Drop what this session created; stop the embedded server and remove its folder."""
        import psycopg

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
        """A fresh, migrated database (a clone of the template); returns its URL."""
        import psycopg

        with self._lock:
            name = f"mink_{os.getpid()}_{next(self._counter)}"
            self._databases.add(name)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {self.template}")
        return self.url_for(name)

    def drop_database(self, url: str) -> None:
        import psycopg

        name = urlsplit(url).path.lstrip("/")
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        with self._lock:
            self._databases.discard(name)

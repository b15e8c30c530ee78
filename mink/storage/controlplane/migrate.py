"""Numbered SQL migrations for the metadata schema.

Files `mink/storage/controlplane/sql/NNNN_name.sql` are applied in order of their number and
recorded in `schema_migrations(version, name, applied_at)`. All pending migrations are applied
in one transaction that first takes a transaction-level advisory lock, so nodes starting at
the same time apply them once, one after the other; a node that finds them applied does
nothing. A recorded version whose file name changed is an error (migrations are never edited
after release: add a new one).

`migrate_sync(conninfo)` (sync psycopg: tests, tools) and `await migrate(conn)` (an asyncio
psycopg AsyncConnection, used by MetadataStore.open) share the listing and planning code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

MIGRATIONS_DIR = Path(__file__).with_name("sql")

# pg_advisory_xact_lock(bigint) key: "minkmigr" in ASCII
LOCK_KEY = int.from_bytes(b"minkmigr", "big")

_FILE_RE = re.compile(r"^(\d{4})_([A-Za-z0-9_]+)\.sql$")

SQL_LOCK = "SELECT pg_advisory_xact_lock(%s)"
SQL_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""
SQL_APPLIED = "SELECT version, name FROM schema_migrations ORDER BY version"
SQL_RECORD = "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)"


class MigrationError(Exception):
    pass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")


def list_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migration files, by version. Other files in the directory are ignored."""
    found: dict[int, Migration] = {}
    for path in sorted(directory.iterdir()):
        m = _FILE_RE.match(path.name)
        if not m:
            continue
        version = int(m.group(1))
        if version in found:
            raise MigrationError(f"two migrations numbered {version}: "
                                 f"{found[version].path.name}, {path.name}")
        found[version] = Migration(version, m.group(2), path)
    return [found[v] for v in sorted(found)]


def pending(applied: dict[int, str], migrations: list[Migration]) -> list[Migration]:
    """Migrations not applied yet, checking that applied ones still have the same name."""
    for m in migrations:
        if m.version in applied and applied[m.version] != m.name:
            raise MigrationError(f"migration {m.version} is recorded as "
                                 f"{applied[m.version]!r} but the file is {m.name!r}")
    return [m for m in migrations if m.version not in applied]


def migrate_sync(conninfo: str, directory: Path = MIGRATIONS_DIR) -> list[int]:
    """Apply pending migrations; returns the versions applied now."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return migrate_conn_sync(conn, directory)


def migrate_conn_sync(conn: psycopg.Connection, directory: Path = MIGRATIONS_DIR) -> list[int]:
    migrations = list_migrations(directory)
    with conn.transaction():
        conn.execute(SQL_LOCK, (LOCK_KEY,))
        conn.execute(SQL_CREATE_TABLE)
        applied = dict(conn.execute(SQL_APPLIED).fetchall())
        todo = pending(applied, migrations)
        for m in todo:
            conn.execute(m.sql())  # no parameters: simple protocol, several statements allowed
            conn.execute(SQL_RECORD, (m.version, m.name))
    return [m.version for m in todo]


async def migrate(conn: psycopg.AsyncConnection, directory: Path = MIGRATIONS_DIR) -> list[int]:
    """Apply pending migrations on an asyncio psycopg connection (not in a transaction)."""
    migrations = list_migrations(directory)
    async with conn.transaction():
        await conn.execute(SQL_LOCK, (LOCK_KEY,))
        await conn.execute(SQL_CREATE_TABLE)
        applied = dict(await (await conn.execute(SQL_APPLIED)).fetchall())
        todo = pending(applied, migrations)
        for m in todo:
            await conn.execute(m.sql())
            await conn.execute(SQL_RECORD, (m.version, m.name))
    return [m.version for m in todo]

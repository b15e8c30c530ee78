"""ACLs in PostgreSQL (`sql/0023_acls.sql`): read all of them, create some, delete some.

A binding is a plain tuple of Kafka's codes and strings, in the table's column order:
(resource_type, resource_name, pattern_type, principal, host, operation, permission_type).
`mink/broker/security/acls.py` validates and matches them; nothing here knows the rules.
"""

from __future__ import annotations

from collections.abc import Sequence

from mink.storage.controlplane.postgres import READ, WRITE, MetadataStore

AclRow = tuple[int, str, int, str, str, int, int]

SQL_ACLS = """
SELECT resource_type, resource_name, pattern_type, principal, host, operation,
       permission_type
  FROM acls ORDER BY resource_type, resource_name, pattern_type, principal, host, operation,
                     permission_type"""
_ARGS = "%s::int2[], %s::text[], %s::int2[], %s::text[], %s::text[], %s::int2[], %s::int2[]"
SQL_CREATE_ACLS = f"SELECT mink_create_acls({_ARGS})"
SQL_DELETE_ACLS = f"SELECT * FROM mink_delete_acls({_ARGS})"


def _columns(rows: Sequence[AclRow]) -> tuple[list, ...]:
    return tuple([r[i] for r in rows] for i in range(7))


def _row(r) -> AclRow:
    return (int(r[0]), str(r[1]), int(r[2]), str(r[3]), str(r[4]), int(r[5]), int(r[6]))


async def acls(store: MetadataStore) -> list[AclRow]:
    """Every stored binding."""
    return [_row(r) for r in await store.fetch_all(READ, SQL_ACLS)]


async def create_acls(store: MetadataStore, rows: Sequence[AclRow]) -> int:
    """Store the bindings (existing ones stay) with one change-log row; its view version."""
    row = await store.fetch_one(WRITE, SQL_CREATE_ACLS, _columns(rows))
    assert row is not None
    return int(row[0])


async def delete_acls(store: MetadataStore, rows: Sequence[AclRow]) -> list[AclRow]:
    """Delete exactly these bindings; the ones that were there and are gone now."""
    return [_row(r) for r in await store.fetch_all(WRITE, SQL_DELETE_ACLS, _columns(rows))]


__all__ = ["AclRow", "acls", "create_acls", "delete_acls"]

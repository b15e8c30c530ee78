"""Client quotas in PostgreSQL (`sql/0015_quotas.sql`): read all of them, alter some.

Entities are passed encoded (`user_part`, `client_part`: '' absent, '*' default, '=name');
`mink/broker/quotas/entities.py` encodes and decodes them and validates every request
before it gets here.
"""

from __future__ import annotations

from collections.abc import Sequence

from mink.storage.controlplane.postgres import READ, WRITE, MetadataStore

SQL_CLIENT_QUOTAS = """
SELECT user_part, client_part, quota_key, value FROM client_quotas
 ORDER BY user_part, client_part, quota_key"""
SQL_ALTER_CLIENT_QUOTAS = """
SELECT mink_alter_client_quotas(%s::text[], %s::text[], %s::text[], %s::float8[],
                                %s::boolean[])"""

# (user part, client part, key, value, remove)
QuotaOp = tuple[str, str, str, float, bool]


async def client_quotas(store: MetadataStore) -> list[tuple[str, str, str, float]]:
    """Every stored quota: (user part, client part, key, value)."""
    return [tuple(r) for r in await store.fetch_all(READ, SQL_CLIENT_QUOTAS)]


async def alter_client_quotas(store: MetadataStore, ops: Sequence[QuotaOp]) -> int:
    """Apply the ops in one transaction with one change-log row; returns its view version."""
    row = await store.fetch_one(WRITE, SQL_ALTER_CLIENT_QUOTAS, (
        [o[0] for o in ops], [o[1] for o in ops], [o[2] for o in ops],
        [float(o[3]) for o in ops], [bool(o[4]) for o in ops]))
    assert row is not None
    return int(row[0])


__all__ = ["QuotaOp", "alter_client_quotas", "client_quotas"]

"""Security state in PostgreSQL: SCRAM credentials (`sql/0018_scram_credentials.sql`) and
nodes' advertised listeners (`sql/0019_node_endpoints.sql`). Values are passed as they are
stored; `mink/broker/security/` computes and checks them."""

from __future__ import annotations

from collections.abc import Sequence

from mink.storage.controlplane.postgres import IDEMPOTENT, READ, WRITE, MetadataStore

# (user, mechanism, salt, stored key, server key, iterations)
CredentialRow = tuple[str, str, bytes, bytes, bytes, int]

SQL_CREDENTIALS_OF = """
SELECT user_name, mechanism, salt, stored_key, server_key, iterations
  FROM scram_credentials WHERE user_name = %s"""
SQL_ALL_CREDENTIALS = """
SELECT user_name, mechanism, iterations FROM scram_credentials ORDER BY user_name, mechanism"""
SQL_UPSERT_CREDENTIAL = """
INSERT INTO scram_credentials (user_name, mechanism, salt, stored_key, server_key, iterations)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (user_name, mechanism) DO UPDATE
   SET salt = excluded.salt, stored_key = excluded.stored_key,
       server_key = excluded.server_key, iterations = excluded.iterations, updated_at = now()
RETURNING user_name"""
SQL_DELETE_CREDENTIAL = """
DELETE FROM scram_credentials WHERE user_name = %s AND mechanism = %s RETURNING user_name"""
SQL_SET_NODE_ENDPOINTS = """
SELECT mink_set_node_endpoints(%s::int, %s::bigint, %s::text[], %s::text[], %s::text[],
                               %s::int[])"""


async def credentials_of(store: MetadataStore, user: str) -> list[CredentialRow]:
    rows = await store.fetch_all(READ, SQL_CREDENTIALS_OF, (user,))
    return [(r[0], r[1], bytes(r[2]), bytes(r[3]), bytes(r[4]), int(r[5])) for r in rows]


async def described_credentials(store: MetadataStore) -> list[tuple[str, str, int]]:
    """(user, mechanism, iterations) of every stored credential."""
    return [(r[0], r[1], int(r[2])) for r in await store.fetch_all(READ, SQL_ALL_CREDENTIALS)]


async def upsert_credential(store: MetadataStore, row: CredentialRow) -> None:
    await store.fetch_one(IDEMPOTENT, SQL_UPSERT_CREDENTIAL, row)


async def delete_credential(store: MetadataStore, user: str, mechanism: str) -> bool:
    """False when there was no such credential."""
    return await store.fetch_one(WRITE, SQL_DELETE_CREDENTIAL, (user, mechanism)) is not None


async def set_node_endpoints(store: MetadataStore, node_id: int, node_epoch: int,
                             endpoints: Sequence[tuple[str, str, str, int]]) -> bool:
    """Replace the node's advertised listeners: (name, security protocol, host, port).
    False (nothing written) unless node_epoch is its current, live registration."""
    row = await store.fetch_one(IDEMPOTENT, SQL_SET_NODE_ENDPOINTS, (
        node_id, node_epoch, [e[0] for e in endpoints], [e[1] for e in endpoints],
        [e[2] for e in endpoints], [int(e[3]) for e in endpoints]))
    return bool(row and row[0])


__all__ = ["CredentialRow", "credentials_of", "delete_credential", "described_credentials",
           "set_node_endpoints", "upsert_credential"]

"""Dynamic broker configs in PostgreSQL (`sql/0032_broker_configs.sql`): read all of them,
replace one resource's with a compare-and-set. Resource '' is the cluster-wide default, a
decimal node id one broker's own; `mink/broker/broker_configs.py` validates every change
before it gets here."""

from __future__ import annotations

import msgspec

from mink.storage.controlplane.api import MetadataError
from mink.storage.controlplane.postgres import READ, WRITE, MetadataStore
from mink.storage.pgtext import dict_from_pg, dict_to_pg

SQL_BROKER_CONFIGS = "SELECT resource_name, config FROM broker_configs ORDER BY resource_name"
SQL_ALTER_BROKER_CONFIG = "SELECT mink_alter_broker_config(%s::text, %s::jsonb, %s::jsonb)"

_json = msgspec.json.Encoder()


class BrokerConfigChanged(MetadataError):
    """The resource's configs moved since they were read: read them again and retry."""


async def broker_configs(store: MetadataStore) -> dict[str, dict[str, str]]:
    """Resource name -> its stored configs (name -> value)."""
    return {name: dict_from_pg(config)
            for name, config in await store.fetch_all(READ, SQL_BROKER_CONFIGS)}


async def alter_broker_config(store: MetadataStore, resource: str, expected: dict[str, str],
                              config: dict[str, str]) -> None:
    """Replace the resource's configs if they still are `expected` (BrokerConfigChanged otherwise).
    Writes a change-log row when they change."""
    row = await store.fetch_one(WRITE, SQL_ALTER_BROKER_CONFIG, (
        resource, _json.encode(dict_to_pg(expected)).decode(),
        _json.encode(dict_to_pg(config)).decode()))
    assert row is not None
    if row[0] == "changed":
        raise BrokerConfigChanged(resource or "(default)")


__all__ = ["BrokerConfigChanged", "alter_broker_config", "broker_configs"]

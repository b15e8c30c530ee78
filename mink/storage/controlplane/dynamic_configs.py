"""Dynamic configs of BROKER and GROUP resources in PostgreSQL
(`sql/0032_dynamic_configs.sql`): read all of them, replace one resource's with a
compare-and-set. A BROKER resource is '' (the cluster-wide default) or a decimal node id, a
GROUP resource a group id; `mink/broker/dynamic_configs.py` validates every change before it
gets here."""

from __future__ import annotations

import msgspec

from mink.storage.controlplane.api import MetadataError
from mink.storage.controlplane.postgres import READ, WRITE, MetadataStore
from mink.storage.pgtext import dict_from_pg, dict_to_pg, from_pg, to_pg

SQL_DYNAMIC_CONFIGS = """
SELECT resource_type, resource_name, config FROM dynamic_configs
 ORDER BY resource_type, resource_name"""
SQL_ALTER_DYNAMIC_CONFIG = """
SELECT mink_alter_dynamic_config(%s::smallint, %s::text, %s::jsonb, %s::jsonb)"""

_json = msgspec.json.Encoder()


class DynamicConfigChanged(MetadataError):
    """The resource's configs moved since they were read: read them again and retry."""


async def dynamic_configs(store: MetadataStore) -> dict[tuple[int, str], dict[str, str]]:
    """(resource type, resource name) -> its stored configs (name -> value)."""
    return {(int(kind), from_pg(name)): dict_from_pg(config)
            for kind, name, config in await store.fetch_all(READ, SQL_DYNAMIC_CONFIGS)}


async def alter_dynamic_config(store: MetadataStore, resource_type: int, name: str,
                               expected: dict[str, str], config: dict[str, str]) -> None:
    """Replace the resource's configs if they still are `expected` (DynamicConfigChanged
    otherwise). Writes a change-log row when they change."""
    row = await store.fetch_one(WRITE, SQL_ALTER_DYNAMIC_CONFIG, (
        resource_type, to_pg(name), _json.encode(dict_to_pg(expected)).decode(),
        _json.encode(dict_to_pg(config)).decode()))
    assert row is not None
    if row[0] == "changed":
        raise DynamicConfigChanged(f"{resource_type}/{name}")


__all__ = ["DynamicConfigChanged", "alter_dynamic_config", "dynamic_configs"]

"""Every piece of Mink the harness uses, imported in this one place.

The harness reaches into Mink's internals (the node, its config, the embedded PostgreSQL, the
migrations, the object store wrappers, the record decoder). When those move, this file is the
one to edit. It is imported only once a fixture or `open_node`/`open_cluster` is used, never by
the pytest plugin at start-up.
"""

from __future__ import annotations

from mink.broker.config import Config
from mink.broker.cluster.view import TopicInfo
from mink.broker.node import Node, run_node
from mink.broker.topics.admin import NotClusterCoordinator
from mink.protocol.records import iter_batches, iter_records
from mink.storage.embedded_postgres import EmbeddedPostgres, free_port
from mink.storage.controlplane import MetadataError, MetadataUnavailable, StaleEpoch, TopicExists
from mink.storage.controlplane.migrate import migrate_sync
from mink.storage.objectstore import (
    FaultyObjectStore,
    ObjectStore,
    ObjectStoreUnavailable,
    open_object_store,
)

__all__ = [
    "Config", "EmbeddedPostgres", "FaultyObjectStore", "MetadataError", "MetadataUnavailable",
    "Node", "NotClusterCoordinator", "ObjectStore", "ObjectStoreUnavailable", "StaleEpoch",
    "TopicExists", "TopicInfo", "free_port", "iter_batches", "iter_records", "migrate_sync",
    "open_object_store", "run_node",
]

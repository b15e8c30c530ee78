"""The node's authorizer (Kafka's `authorizer.class.name`): the ACLs read from PostgreSQL,
super users, and the checks handlers make before acting.

Off by default (`authorizer_enabled`): every check then allows, as a Kafka broker without an
authorizer does, and CreateAcls / DescribeAcls / DeleteAcls answer SECURITY_DISABLED. On, the
rules are `acls.py`'s; the bindings live in `acls` (sql/0023) and every node reads them all
again when its view version moves (`refresh`, from the sync task, as quotas), so a change
made on any node reaches every node within a sync.

A request another node forwarded arrives in an Envelope (`handlers/envelope.py`), which is
accepted only from a principal with CLUSTER_ACTION on the cluster; the request inside is
checked here like any other, as the original client's principal from the original client's
host (`RequestContext.principal`, `RequestContext.client_host`). Nothing else bypasses the
checks: no client id, no listener.

Handlers call the helpers with their request context: `topic`, `group`, `cluster`,
`transactional_id` (one resource, a bool), `topics` (the allowed subset of names),
`idempotent_write` (KIP-679) and the KIP-430 `*_operations` bit fields.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from mink.broker.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclIndex,
    ResourceType,
    parse_super_users,
)
from mink.broker.security.operations import (
    CLUSTER_SUPPORTED,
    GROUP_SUPPORTED,
    OMITTED,
    TOPIC_SUPPORTED,
    AclOperation,
    cluster_operations,
    group_operations,
    topic_operations,
)
from mink.storage.controlplane import MetadataUnavailable
from mink.storage.controlplane.acls import acls, create_acls, delete_acls

log = logging.getLogger(__name__)

READ = AclOperation.READ
WRITE = AclOperation.WRITE
CREATE = AclOperation.CREATE
DELETE = AclOperation.DELETE
ALTER = AclOperation.ALTER
DESCRIBE = AclOperation.DESCRIBE
DESCRIBE_CONFIGS = AclOperation.DESCRIBE_CONFIGS
ALTER_CONFIGS = AclOperation.ALTER_CONFIGS
IDEMPOTENT_WRITE = AclOperation.IDEMPOTENT_WRITE

TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
CLUSTER = ResourceType.CLUSTER
TRANSACTIONAL_ID = ResourceType.TRANSACTIONAL_ID
CONFIG_TOPIC = 2  # Kafka's ConfigResource.Type: TOPIC 2, BROKER 4, BROKER_LOGGER 8, GROUP 32
CONFIG_GROUP = 32

CLUSTER_ACTION = AclOperation.CLUSTER_ACTION


class Authorizer:
    def __init__(self, node) -> None:
        self.node = node
        config = node.config
        self.enabled: bool = config.authorizer_enabled
        self.super_users = parse_super_users(config.super_users)
        self.allow_if_no_acl: bool = config.allow_everyone_if_no_acl_found
        self.index = AclIndex()
        self.loaded_version = -1

    # -- from PostgreSQL ---------------------------------------------------------------------

    async def refresh(self, view_version: int) -> None:
        """Read every ACL again if the view moved since the last read."""
        if not self.enabled or view_version == self.loaded_version:
            return
        index = AclIndex(AclBinding(*row) for row in await acls(self.node.metadata))
        if index.bindings != self.index.bindings:
            log.info("acls: %d bindings", len(index.bindings))
        self.index = index
        self.loaded_version = view_version

    async def create(self, bindings: list[AclBinding]) -> None:
        await create_acls(self.node.metadata, [b.row() for b in bindings])
        await self._reload()

    async def delete(self, bindings: list[AclBinding]) -> list[AclBinding]:
        deleted = [AclBinding(*row) for row in
                   await delete_acls(self.node.metadata, [b.row() for b in bindings])]
        if deleted:
            await self._reload()
        return deleted

    async def _reload(self) -> None:
        try:
            await self.node.sync.refresh_view()  # this node at once; the others by NOTIFY
        except MetadataUnavailable as exc:  # stored; the sync loop catches up
            log.warning("view refresh after an ACL change failed: %s", exc)

    # -- decisions ---------------------------------------------------------------------------

    def _bypass(self, ctx) -> bool:
        return not self.enabled or str(ctx.principal) in self.super_users

    def allows(self, ctx, operation: int, resource_type: int, name: str) -> bool:
        if self._bypass(ctx):
            return True
        return self.index.authorize(str(ctx.principal), ctx.client_host, operation,
                                    resource_type, name, self.allow_if_no_acl)

    def topic(self, ctx, operation: int, name: str) -> bool:
        return self.allows(ctx, operation, TOPIC, name)

    def group(self, ctx, operation: int, group_id: str) -> bool:
        return self.allows(ctx, operation, GROUP, group_id)

    def cluster(self, ctx, operation: int) -> bool:
        return self.allows(ctx, operation, CLUSTER, CLUSTER_NAME)

    def transactional_id(self, ctx, operation: int, transactional_id: str) -> bool:
        return self.allows(ctx, operation, TRANSACTIONAL_ID, transactional_id)

    def topics(self, ctx, operation: int, names: Iterable[str]) -> set[str]:
        """The names the principal may perform the operation on."""
        if self._bypass(ctx):
            return set(names)
        return {n for n in names if self.topic(ctx, operation, n)}

    def config_refusal(self, ctx, operation: int, resource_type: int,
                       name: str) -> tuple[ErrorCode, str] | None:
        """DescribeConfigs / AlterConfigs / IncrementalAlterConfigs: DESCRIBE_CONFIGS or
        ALTER_CONFIGS on the topic or the group, or on the cluster for a broker (or broker
        logger)."""
        if resource_type == CONFIG_TOPIC:
            if not self.topic(ctx, operation, name):
                return (ErrorCode.topic_authorization_failed,
                        "Topic authorization failed.")
        elif resource_type == CONFIG_GROUP:
            if not self.group(ctx, operation, name):
                return (ErrorCode.group_authorization_failed,
                        "Group authorization failed.")
        elif not self.cluster(ctx, operation):
            return ErrorCode.cluster_authorization_failed, "Cluster authorization failed."
        return None

    def may_create_topic(self, ctx, name: str) -> bool:
        """CREATE on the cluster or on the topic (CreateTopics, auto-creation)."""
        return self.cluster(ctx, CREATE) or self.topic(ctx, CREATE, name)

    def idempotent_write(self, ctx) -> bool:
        """KIP-679: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic."""
        if self.cluster(ctx, IDEMPOTENT_WRITE):
            return True
        if self.allow_if_no_acl and not any(b.resource_type == TOPIC
                                            for b in self.index.bindings):
            return True
        return self.index.any_allowed(str(ctx.principal), ctx.client_host, WRITE, TOPIC)

    # -- KIP-430 authorized operations -------------------------------------------------------

    def _operations(self, ctx, resource_type: int, name: str, supported) -> int:
        if self._bypass(ctx):
            return sum(1 << op for op in supported)
        allowed = self.index.allowed_operations(str(ctx.principal), ctx.client_host,
                                                resource_type, name, self.allow_if_no_acl,
                                                supported)
        return sum(1 << op for op in allowed)

    def topic_operations(self, ctx, name: str, asked: bool) -> int:
        if not asked:
            return OMITTED
        if not self.enabled:
            return topic_operations(True)
        return self._operations(ctx, TOPIC, name, TOPIC_SUPPORTED)

    def group_operations(self, ctx, group_id: str, asked: bool) -> int:
        if not asked:
            return OMITTED
        if not self.enabled:
            return group_operations(True)
        return self._operations(ctx, GROUP, group_id, GROUP_SUPPORTED)

    def cluster_operations(self, ctx, asked: bool) -> int:
        """DescribeCluster, Metadata v8-10: none (0) without DESCRIBE on the cluster, whatever
        else is allowed, as Kafka's AuthHelper.computeDescribeClusterResponse and
        handleTopicMetadataRequest."""
        if not asked:
            return OMITTED
        if not self.enabled:
            return cluster_operations(True)
        if not self.cluster(ctx, DESCRIBE):
            return 0
        return self._operations(ctx, CLUSTER, CLUSTER_NAME, CLUSTER_SUPPORTED)

    def memo_key(self, ctx):
        """What a cached answer that depends on rights must be keyed by too: nothing while
        the authorizer is off or for a bypassing principal, else the principal, its host
        and the ACLs' version."""
        if self._bypass(ctx):
            return None
        return (str(ctx.principal), ctx.client_host, self.loaded_version)


__all__ = ["Authorizer"]
